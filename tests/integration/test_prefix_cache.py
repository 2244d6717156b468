"""The CPU stand-in's prefix cache through a real `bentoml serve`: a request that shares a long
prefix with an earlier one reports the reused prompt tokens in its usage (OpenAI's
`cached_tokens`, Anthropic's `cache_read_input_tokens`) and answers what it would without the
cache, on the direct route (`--enable-kv-cache-reuse true`) and the llmapi route (the LLM API's
`kv_cache_config.enable_block_reuse`, on by default)."""

from __future__ import annotations

import anthropic
import pytest

from tests.integration.conftest import CLIENT_TIMEOUT_S, openai_client, pack, start_bento_server

pytestmark = pytest.mark.timeout(600)

BLOCK = 16
PACKS = {
    "direct": ("--enable-kv-cache-reuse", "true"),
    "llmapi": ("--workflow", "llmapi"),
}


@pytest.fixture(scope="module", params=list(PACKS))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    tag = pack(
        "--demo", *PACKS[request.param], "--tokens-per-block", str(BLOCK),
        "--max-input-len", "1400", "--max-seq-len", "1500",
    )  # fmt: skip
    started = start_bento_server(tag, tmp_path_factory.mktemp("prefix-cache"))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def prefix(demo_tokenizer) -> list[int]:
    """About a thousand tokens of text, as token ids."""
    text = " ".join(
        f"Item {i} of the long shared system prompt is written here." for i in range(90)
    )
    return list(demo_tokenizer.encode(text))[:1000]


def test_a_shared_prefix_is_reported_cached_and_changes_nothing(server, prefix) -> None:
    client = openai_client(server, CLIENT_TIMEOUT_S)
    model = client.models.list().data[0].id
    first = client.completions.create(
        model=model, prompt=prefix + [5, 6, 7], max_tokens=4, temperature=0
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    follow_up = prefix + [9, 10, 11, 12]
    cached = client.completions.create(model=model, prompt=follow_up, max_tokens=8, temperature=0)
    reused = cached.usage.prompt_tokens_details.cached_tokens
    assert reused >= 0.9 * len(prefix) and reused % BLOCK == 0 and reused < len(follow_up)
    # The same prompt scored in full (prompt scores skip the cache) answers the same text.
    fresh = client.completions.create(
        model=model,
        prompt=follow_up,
        max_tokens=8,
        temperature=0,
        extra_body={"prompt_logprobs": 0},
    )
    assert fresh.choices[0].text == cached.choices[0].text


def test_anthropic_usage_reports_the_cache_read(server) -> None:
    model = openai_client(server, CLIENT_TIMEOUT_S).models.list().data[0].id
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    system = " ".join(f"Rule {i}: answer briefly and politely." for i in range(60))
    for question, expect_cached in (("What is two and two?", False), ("And three?", True)):
        message = client.messages.create(
            model=model, max_tokens=4, system=system,
            messages=[{"role": "user", "content": question}],
        )  # fmt: skip
        read = message.usage.cache_read_input_tokens or 0
        assert (read > 0) is expect_cached, message.usage


def replayed_events(endpoint: str) -> list[dict]:
    """Every event the replica's replay socket still holds, from sequence 0 (as vllm-router
    asks for what it missed): the DEALER protocol of vLLM's publisher."""
    import msgpack
    import zmq

    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    events: list[dict] = []
    try:
        while True:
            assert dealer.poll(10_000), "no answer from the replay socket"
            _empty, _topic, seq, payload = dealer.recv_multipart()
            if seq == (-1).to_bytes(8, "big", signed=True):
                return events
            events.extend(msgpack.unpackb(payload)[1])
    finally:
        dealer.close(linger=0)


def test_a_restart_that_loses_the_cache_says_so_in_the_events(
    tmp_path_factory: pytest.TempPathFactory, prefix: list[int]
) -> None:
    """The engine publishes its blocks as vLLM's events; when tritonserver dies and comes back
    with an empty cache, its events start again with AllBlocksCleared, so a router drops what
    the replica no longer holds."""
    import psutil

    from tensorrtllm_backend.triton.command import find_free_port
    from tests.integration.conftest import serves_requests
    from tests.waiting import wait_for

    live, replay = (f"tcp://127.0.0.1:{find_free_port()}" for _ in range(2))
    tag = pack("--demo", "--enable-kv-cache-reuse", "true", "--tokens-per-block", str(BLOCK))
    env = {"TRTLLM_KV_EVENTS_ENDPOINT": live, "TRTLLM_KV_EVENTS_REPLAY_ENDPOINT": replay}
    server = start_bento_server(tag, tmp_path_factory.mktemp("restart"), env)
    try:
        client = openai_client(server, CLIENT_TIMEOUT_S)
        model = client.models.list().data[0].id
        client.completions.create(model=model, prompt=prefix[:200], max_tokens=2)
        stored = wait_for(
            lambda: [e for e in replayed_events(replay) if e["type"] == "BlockStored"], 30
        )
        assert stored and stored[0]["block_size"] == BLOCK
        (triton,) = [p for p in server.tritons() if "tritonserver" in p.cmdline()[0]]
        triton.kill()
        psutil.wait_procs([triton], timeout=15)
        assert wait_for(lambda: serves_requests(server.url), 120, 0.5), server.log()[-3000:]
        after = replayed_events(replay)
        assert after and after[0]["type"] == "AllBlocksCleared"
        assert not [e for e in after if e["type"] == "BlockStored"]  # the old blocks are gone
    finally:
        server.stop()
