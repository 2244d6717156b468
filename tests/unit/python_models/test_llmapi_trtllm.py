"""Our llmapi model over `tensorrt_llm`, without installing it: the model's request handling
(python_models/llmapi/model.py and its adapter, trtllm.py) runs against a fake `tensorrt_llm`
built from the documented API (fake_tensorrt_llm.py), whose classes accept exactly the
documented keywords: any keyword we pass that the contract lacks fails these tests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import io
import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path

import fake_tensorrt_llm
import llmapi_harness as harness
import pytest

from tensorrtllm_backend.python_models.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

MODEL_YAML = {
    "model": "/models/llama",
    "backend": "pytorch",
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "guided_decoding_backend": "xgrammar",
    "kv_cache_config": {"free_gpu_memory_fraction": 0.8},
    "triton_config": {"max_batch_size": 0, "decoupled": True},
}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRTLLM_LLMAPI_IMPL", "tensorrt_llm")
    return fake_tensorrt_llm.install(monkeypatch)


def serve(monkeypatch, tmp_path: Path, **model_yaml):
    module = harness.model_module(monkeypatch)
    settings = {**MODEL_YAML, **model_yaml}
    return harness.start_model(module, harness.write_version_dir(tmp_path, settings))


@pytest.fixture
def model(fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    started = serve(monkeypatch, tmp_path)
    yield started
    started.finalize()


def sampling_params(fake) -> dict:
    """The SamplingParams of the last call, as the fields set to other than their default."""
    params = fake.calls[-1]["sampling_params"]
    defaults = type(params)()
    return {
        f.name: getattr(params, f.name)
        for f in dataclasses.fields(params)
        if getattr(params, f.name) != getattr(defaults, f.name)
    }


def test_one_llm_is_built_from_model_yaml(model, fake) -> None:
    (llm,) = fake.llms
    assert llm.args["model"] == "/models/llama"
    assert llm.args["kv_cache_config"] == {"free_gpu_memory_fraction": 0.8}
    assert llm.args["guided_decoding_backend"] == "xgrammar"
    assert "triton_config" not in llm.args


def test_an_unknown_llm_argument_fails_the_load(fake, monkeypatch, tmp_path) -> None:
    with pytest.raises(ValueError, match="invalid argument"):
        serve(monkeypatch, tmp_path, no_such_argument=1)


def test_token_ids_stream_as_deltas_one_response_per_yield(model, fake) -> None:
    request = harness.token_request([1, 5, 9], streaming=True, sampling_param_max_tokens=4,
                            return_finish_reason=True,
                            sampling_param_exclude_input_from_output=True)  # fmt: skip
    model.execute([request])
    responses = request.wait()
    assert [r["output_ids"] for r in responses] == [[100], [101], [102], [103]]
    assert [r["finish_reason"] for r in responses] == [["None"]] * 3 + [["length"]]
    assert responses[-1]["cached_tokens"] == [3]
    assert all(r["sequence_index"] == [0] for r in responses)
    (call,) = fake.calls
    assert call["inputs"] == {"prompt_token_ids": [1, 5, 9]}
    assert call["streaming"] is True and call["lora_request"] is None
    assert sampling_params(fake) == {"max_tokens": 4, "detokenize": False}
    assert call["sampling_params"].exclude_input_from_output is True
    # As NVIDIA's tensor (and the C++ backend's) says by default: the prompt comes first.
    echoed = harness.token_request([1, 5, 9], streaming=True, sampling_param_max_tokens=2)
    model.execute([echoed])
    assert [r["output_ids"] for r in echoed.wait()] == [[1, 5, 9, 100], [101]]


def test_nvidias_request_gets_nvidias_text_so_far(model, fake) -> None:
    request = harness.text_request(
        "Hi", streaming=True, sampling_param_max_tokens=3, sampling_param_temperature=0.5,
        sampling_param_stop=["x", "y"], return_finish_reason=True, return_stop_reason=True,
        sampling_param_exclude_input_from_output=False,
    )  # fmt: skip
    model.execute([request])
    responses = request.wait()
    assert [r["text_output"] for r in responses] == [
        ["Hi<100>"],
        ["Hi<100><101>"],
        ["Hi<100><101><102>"],
    ]
    assert [r["finish_reason"] for r in responses] == [["None"], ["None"], ["length"]]
    assert responses[-1]["stop_reason"] == ["None"]
    assert fake.calls[-1]["inputs"] == "Hi"
    sent = sampling_params(fake)
    assert sent["temperature"] == pytest.approx(0.5) and sent["stop"] == ["x", "y"]
    # The model prepends the prompt itself.
    assert fake.calls[-1]["sampling_params"].exclude_input_from_output is True


def test_non_streaming_requests_get_one_response(model) -> None:
    text = harness.text_request(
        "Hi", sampling_param_max_tokens=2, sampling_param_exclude_input_from_output=True
    )
    ids = harness.token_request(
        [4], sampling_param_max_tokens=3, sampling_param_exclude_input_from_output=True
    )
    model.execute([text, ids])
    assert text.wait() == [{"text_output": ["<100><101>"], "cached_tokens": [3]}]
    assert [r["output_ids"] for r in ids.wait()] == [[100, 101, 102]]


def test_several_sequences_answer_by_sequence_index(model, fake) -> None:
    request = harness.token_request([4], streaming=True, sampling_param_max_tokens=2, sampling_param_n=2,
                            sampling_param_exclude_input_from_output=True)  # fmt: skip
    model.execute([request])
    responses = request.wait()
    by_index: dict[int, list[int]] = {}
    for response in responses:
        by_index.setdefault(response["sequence_index"][0], []).extend(response["output_ids"])
    assert by_index == {0: [100, 101], 1: [110, 111]}
    assert sampling_params(fake)["n"] == 2
    text = harness.text_request("Hi", sampling_param_max_tokens=1, sampling_param_n=2,
                        sampling_param_exclude_input_from_output=True)  # fmt: skip
    model.execute([text])
    assert text.wait()[-1]["text_output"] == ["<100>", "<110>"]  # NVIDIA's: one per output


def test_log_probs_and_their_alternatives_come_from_the_ranked_entries(model, fake) -> None:
    request = harness.token_request([4], streaming=True, sampling_param_max_tokens=2,
                            sampling_param_logprobs=3)  # fmt: skip
    model.execute([request])
    first, second = request.wait()
    assert sampling_params(fake)["logprobs"] == 3
    assert first["output_log_probs"] == [-0.25]
    assert first["output_top_token_ids"] == [[100, 1100, 1101]]
    assert first["output_top_log_probs"] == [[-0.25, -1.0, -2.0]]
    assert second["output_top_token_ids"] == [[101, 1101, 1102]]
    chosen = harness.token_request([4], sampling_param_max_tokens=1, sampling_param_logprobs=0)
    model.execute([chosen])
    (only,) = chosen.wait()
    assert only["output_log_probs"] == [-0.25] and "output_top_token_ids" not in only
    assert sampling_params(fake)["logprobs"] == 1  # the chosen token's: the top 1


def test_guides_map_to_guided_decoding_params(model, fake) -> None:
    cases = [
        ("json", None, {"json_object": True}),
        ("json_schema", '{"type": "object"}', {"json": '{"type": "object"}'}),
        ("regex", "[a-z]+", {"regex": "[a-z]+"}),
        ("ebnf_grammar", 'root ::= "a"', {"grammar": 'root ::= "a"'}),
        ("structural_tag", '{"type": "structural_tag"}', {"structural_tag": '{"type": "structural_tag"}'}),
    ]  # fmt: skip
    for kind, guide, expected in cases:
        extra = {"guided_decoding_guide": guide} if guide is not None else {}
        request = harness.token_request([4], sampling_param_max_tokens=1,
                                guided_decoding_guide_type=kind, **extra)  # fmt: skip
        model.execute([request])
        assert request.error() is None
        params = sampling_params(fake)["guided_decoding"]
        assert {k: v for k, v in dataclasses.asdict(params).items() if v} == expected


def test_without_a_guided_decoding_backend_guides_are_refused(fake, monkeypatch, tmp_path) -> None:
    model = serve(monkeypatch, tmp_path, guided_decoding_backend=None)
    try:
        request = harness.token_request([4], guided_decoding_guide_type="json")
        model.execute([request])
        assert "guided_decoding_backend" in request.error()
        assert fake.calls == []  # the LLM API would have dropped the guide without a word
    finally:
        model.finalize()


def test_a_cancelled_request_is_aborted(model, fake) -> None:
    request = harness.token_request([4], streaming=True, sampling_param_max_tokens=100_000)
    fake.step_s = 0.01
    try:
        model.execute([request])
        harness.wait_for(lambda: len(request.sender.responses) >= 2)
        request.sender.cancel()
        harness.wait_for(lambda: len(fake.aborted) == 1)
        output = fake.aborted[0]
        harness.wait_for(lambda: output.finished)
        assert {o.finish_reason for o in output.outputs} == {"cancelled"}
    finally:
        fake.step_s = 0.001


def test_stop_aborts_the_requests_with_its_id(model, fake) -> None:
    fake.step_s = 0.01
    try:
        running = harness.token_request([4], "abc", streaming=True, sampling_param_max_tokens=100_000,
                                return_finish_reason=True)  # fmt: skip
        model.execute([running])
        harness.wait_for(lambda: len(running.sender.responses) >= 1)
        stop = harness.token_request([4], "abc", stop=True)
        model.execute([stop])
        assert stop.wait() == [] and stop.sender.flags_only == 1
        assert running.wait()[-1]["finish_reason"] == ["cancelled"]
        assert len(fake.aborted) == 1
    finally:
        fake.step_s = 0.001


def test_a_request_error_is_that_requests_error(model) -> None:
    failing = harness.token_request([fake_tensorrt_llm.FAIL_TOKEN], streaming=True,
                            sampling_param_max_tokens=10)  # fmt: skip
    model.execute([failing])
    assert "the executor failed on this request" in failing.error()
    healthy = harness.token_request([4], sampling_param_max_tokens=2,
                            sampling_param_exclude_input_from_output=True)  # fmt: skip
    model.execute([healthy])
    assert healthy.wait()[0]["output_ids"] == [100, 101]  # the model lives on


def test_sampling_params_own_validation_is_the_requests_error(model, fake) -> None:
    request = harness.token_request([4], sampling_param_n=2, sampling_param_best_of=1)
    model.execute([request])
    assert "best_of" in request.error()
    assert fake.calls == []


def test_a_lora_adapter_goes_as_a_lora_request(model, fake, tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    request = harness.token_request([4], sampling_param_max_tokens=1, lora_id=7, lora_name="a",
                            lora_path=str(adapter))  # fmt: skip
    model.execute([request])
    assert request.error() is None
    lora = fake.calls[-1]["lora_request"]
    assert (lora.lora_name, lora.lora_int_id, lora.lora_path, lora.lora_ckpt_source) == (
        "a",
        7,
        str(adapter),
        "hf",
    )
    missing = harness.token_request([4], lora_id=8, lora_name="b", lora_path=str(tmp_path / "nope"))
    model.execute([missing])
    assert "does not exist" in missing.error()
    partial = harness.token_request([4], lora_name="b")
    model.execute([partial])
    assert "go together" in partial.error()


def test_an_end_id_beside_stop_strings_becomes_a_stop_token(model, fake) -> None:
    """The LLM API tokenizes stop strings only while end_id is unset."""
    request = harness.token_request([4], sampling_param_max_tokens=1, sampling_param_end_id=9,
                            sampling_param_stop=["END"], sampling_param_bad=["no"],
                            sampling_param_stop_token_ids=[3])  # fmt: skip
    model.execute([request])
    assert request.error() is None
    sent = sampling_params(fake)
    assert "end_id" not in sent and sent["stop_token_ids"] == [3, 9]
    assert sent["stop"] == ["END"] and sent["bad"] == ["no"]
    plain = harness.token_request([4], sampling_param_max_tokens=1, sampling_param_end_id=9,
                          sampling_param_ignore_eos=True, sampling_param_min_tokens=1)  # fmt: skip
    model.execute([plain])
    plain.wait()
    sent = sampling_params(fake)
    assert sent["end_id"] == 9 and sent["ignore_eos"] is True and sent["min_tokens"] == 1


def test_perf_metrics_come_back_as_nvidias_outputs(model, fake) -> None:
    request = harness.token_request([4], sampling_param_max_tokens=1,
                            sampling_param_return_perf_metrics=True)  # fmt: skip
    model.execute([request])
    (response,) = request.wait()
    assert response["arrival_time_ns"] == [1_000_005_000]
    assert response["first_token_time_ns"] == [2_000_000_000]
    assert response["kv_cache_reused_block"] == [2] and response["kv_cache_hit_rate"] == [0.5]


def test_finalize_shuts_the_llm_down(fake, monkeypatch, tmp_path) -> None:
    model = serve(monkeypatch, tmp_path)
    model.finalize()
    assert fake.llms[0].shut_down


def test_prompt_scores_come_from_the_context_logits_beside_the_engine(model, fake) -> None:
    """sampling_param_prompt_logprobs asks the LLM API for context logits (its own
    prompt_logprobs leaves the prompt's token out when it is not in the top k), reduces them
    and answers every prompt token after the first with its log prob, rank and alternatives."""
    import torch

    prompt = [1, 5, 9, 700]
    request = harness.token_request(prompt, streaming=True, sampling_param_max_tokens=1,
                                    sampling_param_prompt_logprobs=2,
                                    sampling_param_exclude_input_from_output=True)  # fmt: skip
    model.execute([request])
    (response,) = request.wait()
    sent = sampling_params(fake)
    assert sent["return_context_logits"] is True and "prompt_logprobs" not in sent
    table = torch.log_softmax(fake_tensorrt_llm.context_logits(prompt), dim=-1)
    own = [table[t, prompt[t + 1]].item() for t in range(len(prompt) - 1)]
    assert response["prompt_log_probs"] == pytest.approx(own, abs=1e-5)
    values, ids = torch.topk(table[:-1], 2, dim=-1)
    assert response["prompt_top_token_ids"] == ids.tolist()
    for row, expected in zip(response["prompt_top_log_probs"], values.tolist(), strict=True):
        assert row == pytest.approx(expected, abs=1e-5)
    assert response["prompt_token_ranks"][2] > 2  # 700 is far from the peak (10): not in the top


def test_prompt_scores_cut_short_by_the_kv_cache_are_refused(model, fake) -> None:
    fake.reused_prompt_tokens = 2
    request = harness.token_request([1, 5, 9, 700], sampling_param_max_tokens=1,
                                    sampling_param_prompt_logprobs=0,
                                    sampling_param_exclude_input_from_output=True)  # fmt: skip
    model.execute([request])
    assert "enable_block_reuse: false" in (request.error() or "")


def test_the_llm_apis_kv_cache_events_are_published_in_vllms_format(
    fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With TRTLLM_KV_EVENTS_ENDPOINT set, the LLM is built with block reuse and an event
    buffer, and its events reach a ZeroMQ subscriber as vLLM's: the cache's creation as
    AllBlocksCleared, a finished request's full blocks as BlockStored (its partial last block
    left out)."""
    from kv_event_subscriber import BlockIndex, free_endpoint

    from tests.waiting import wait_for

    endpoint = free_endpoint()
    monkeypatch.setenv("TRTLLM_KV_EVENTS_ENDPOINT", endpoint)
    started = serve(monkeypatch, tmp_path, kv_cache_config={"tokens_per_block": 8})
    try:
        (llm,) = fake.llms
        assert llm.args["kv_cache_config"]["event_buffer_max_size"] > 0
        assert llm.args["kv_cache_config"]["enable_block_reuse"] is True
        with BlockIndex(endpoint, block_size=8) as index:
            publisher = started.engine._events  # the engine's publisher: probe the subscription
            assert wait_for(
                lambda: index.heard(lambda: publisher.publish([AllBlocksCleared()])), 10
            )
            request = harness.token_request(list(range(1, 21)), sampling_param_max_tokens=1,
                                            sampling_param_exclude_input_from_output=True)  # fmt: skip
            started.execute([request])
            request.wait()
            assert wait_for(lambda: index.drain() and index.events["BlockStored"], 10), index.log
        block = next(event for event in index.log if event["type"] == "BlockStored")
        assert block["token_ids"] == list(range(1, 17)) and block["block_size"] == 8
        assert len(block["block_hashes"]) == 2 and block["parent_block_hash"] is None
    finally:
        started.finalize()


# What the LLM API yields (KVCacheEventSerializer's dicts, JSON-decoded), built from the recorded
# schema (tests/data/llmapi_python_api.json, "kv_cache_events") by the fake.
BIG_HASH = 2**64 - 5  # block hashes are uint64: above 2**63 too


def llm_api_event(data: dict, window: int = 2048, event_id: int = 0, **optional) -> dict:
    event = fake_tensorrt_llm.kv_event(
        "event", event_id=event_id, data=data, window_size=window, **optional
    )
    return json.loads(json.dumps(event))


def numbered(events: list[dict], window: int = 2048) -> list[dict]:
    """Events' data as one event manager sends them: event_id from 0."""
    return [llm_api_event(data, window, event_id) for event_id, data in enumerate(events)]


def stored(parent: int | None, *blocks: tuple[int, list[int]]) -> dict:
    chain = [fake_tensorrt_llm.stored_block(block_hash, tokens) for block_hash, tokens in blocks]
    return fake_tensorrt_llm.kv_event("stored", parent_hash=parent, blocks=chain)


def removed(*hashes: int) -> dict:
    return fake_tensorrt_llm.kv_event("removed", block_hashes=list(hashes))


def created() -> dict:
    return fake_tensorrt_llm.kv_event("created", num_blocks_per_cache_level=[64, 0])


def bridge(block_size: int = 4):
    """The adapter's KvEventBridge, to translate with (no LLM, no publisher)."""
    from tensorrtllm_backend.python_models.llmapi.trtllm import KvEventBridge

    return KvEventBridge(None, None, block_size)


def translated(events: list[dict], block_size: int = 4) -> list[list]:
    """What one bridge makes of each event, in order."""
    translator = bridge(block_size)
    return [translator.translate(event) for event in events]


# Every event type TensorRT-LLM records: the events fed to one bridge, and what the last becomes.
KV_EVENT_CASES = {
    "created": ([created()], [AllBlocksCleared()]),
    "stored": (
        [stored(None, (1, [1, 2, 3, 4]), (BIG_HASH, [5, 6, 7, 8]))],
        [BlockStored([1, BIG_HASH], None, [1, 2, 3, 4, 5, 6, 7, 8], 4)],
    ),
    "removed": (
        [stored(None, (1, [1, 2, 3, 4]), (BIG_HASH, [5, 6, 7, 8])), removed(BIG_HASH, 1)],
        [BlockRemoved([BIG_HASH, 1])],
    ),
    # Dropped: TensorRT-LLM sends "updated" when a block changes cache level (moved to host
    # memory, or back) or retention priority. The block stays reusable at either level (the
    # engine brings a host block back when a prompt reuses it), so a router's index of what this
    # engine can reuse is unchanged; vLLM's BlockStored(medium="CPU") would need the block's
    # token ids, which "updated" does not carry. A "removed" follows when the block leaves.
    "updated": (
        [stored(None, (1, [1, 2, 3, 4])), fake_tensorrt_llm.level_change(1, 0, 1)],
        [],
    ),
}


@pytest.mark.parametrize("kind", sorted(fake_tensorrt_llm.KV_EVENTS["data"]))
def test_each_kv_event_type_the_llm_api_records_has_its_translation(fake, kind) -> None:
    events, expected = KV_EVENT_CASES[kind]
    assert translated(numbered(events))[-1] == expected


def test_a_stored_chain_keeps_its_parent(fake) -> None:
    assert translated([llm_api_event(stored(BIG_HASH, (7, [9, 9, 9, 9])))]) == [
        [BlockStored([7], BIG_HASH, [9, 9, 9, 9], 4)]
    ]


def test_a_partial_block_is_left_out_and_so_is_its_removal(fake) -> None:
    """A sequence's last block may hold fewer tokens than a block: routers that hash full
    blocks of token ids cannot place it, so it is not published, nor is its removal."""
    events = [
        stored(None, (1, [1, 2, 3, 4]), (2, [5, 6])),
        removed(2, 1),
        stored(None, (3, [1, 2])),
        removed(3),
    ]
    assert translated(numbered(events)) == [
        [BlockStored([1], None, [1, 2, 3, 4], 4)],
        [BlockRemoved([1])],
        [],
        [],
    ]


def test_only_the_largest_attention_windows_events_count(fake) -> None:
    """With sliding-window layers each attention window has its own block manager and events;
    a prefix is reusable as far as the full-attention layers (the largest window) hold it."""
    sequence = [
        (created(), 512),
        (created(), 4096),
        (stored(None, (1, [1, 2, 3, 4])), 512),
        (stored(None, (1, [1, 2, 3, 4])), 4096),
        (removed(1), 512),
        (created(), 512),
        (removed(1), 4096),
    ]
    events = [llm_api_event(data, window, n) for n, (data, window) in enumerate(sequence)]
    assert translated(events) == [
        [AllBlocksCleared()],
        [AllBlocksCleared()],
        [],
        [BlockStored([1], None, [1, 2, 3, 4], 4)],
        [],
        [],
        [BlockRemoved([1])],
    ]


def test_what_else_the_llm_api_may_hand_over_is_read(fake) -> None:
    """A None event serializes to {} (nothing to publish); a JSON string is read as its dict."""
    event = llm_api_event(stored(None, (1, [1, 2, 3, 4])))
    assert translated([{}, json.dumps(event)]) == [[], [BlockStored([1], None, [1, 2, 3, 4], 4)]]


def test_a_gap_in_event_ids_clears_the_published_blocks_then_translation_goes_on(
    fake, caplog: pytest.LogCaptureFixture
) -> None:
    """Events dropped before they were read (more than event_buffer_max_size waited) may hold
    evictions: the bridge publishes AllBlocksCleared before the event after the gap, so that no
    subscriber keeps blocks the engine may have evicted, warns once per gap, and translates on."""
    sequence = [
        (0, created()),
        (1, stored(None, (1, [1, 2, 3, 4]))),
        (5, stored(None, (5, [5, 6, 7, 8]))),  # 2 to 4 dropped: block 1's removal, perhaps
        (6, stored(5, (6, [9, 9, 9, 9]))),
        (9, removed(6, 5)),
    ]
    with caplog.at_level(logging.WARNING):
        events = translated([llm_api_event(data, event_id=n) for n, data in sequence])
    assert events == [
        [AllBlocksCleared()],
        [BlockStored([1], None, [1, 2, 3, 4], 4)],
        [AllBlocksCleared(), BlockStored([5], None, [5, 6, 7, 8], 4)],
        [BlockStored([6], 5, [9, 9, 9, 9], 4)],
        [AllBlocksCleared(), BlockRemoved([6, 5])],
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "3 KV-cache events were dropped before event_id 5" in warnings[0]
    assert "2 KV-cache events were dropped before event_id 9" in warnings[1]
    assert all("kv_cache_config.event_buffer_max_size (4096)" in w for w in warnings)


def test_an_event_the_bridge_cannot_read_is_logged_and_the_next_ones_published(
    fake, caplog: pytest.LogCaptureFixture
) -> None:
    from tensorrtllm_backend.python_models.llmapi.trtllm import KvEventBridge

    good = llm_api_event(created(), event_id=0)
    events = ["{not json", good]
    published: list[list] = []

    class LLM:
        async def get_kv_cache_events_async(self, timeout: float):
            while events:
                yield events.pop(0)

    class Publisher:
        def publish(self, batch: list) -> None:
            published.append(batch)

    async def run() -> None:
        task = asyncio.create_task(KvEventBridge(LLM(), Publisher(), 4).run())
        for _ in range(100):
            if published:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    assert published == [[AllBlocksCleared()]]
    assert any("KV-cache event not published" in r.getMessage() for r in caplog.records)


def test_a_first_event_read_other_than_0_follows_dropped_ones_on_each_dp_rank(fake) -> None:
    """Each event manager numbers its events from 0 (its cache's "created"), so a bridge whose
    first event has another id missed some. With attention data parallelism rank 0 relays every
    rank's events, each rank numbered on its own."""
    late = llm_api_event(stored(None, (1, [1, 2, 3, 4])), event_id=7)
    assert translated([late]) == [[AllBlocksCleared(), BlockStored([1], None, [1, 2, 3, 4], 4)]]
    sequence = [
        (0, 0, created()),
        (1, 0, created()),
        (0, 1, stored(None, (1, [1, 2, 3, 4]))),
        (1, 1, stored(None, (2, [5, 6, 7, 8]))),
        (1, 3, removed(2)),
    ]
    events = [llm_api_event(data, event_id=n, attention_dp_rank=r) for r, n, data in sequence]
    assert translated(events) == [
        [AllBlocksCleared()],
        [AllBlocksCleared()],
        [BlockStored([1], None, [1, 2, 3, 4], 4)],
        [BlockStored([2], None, [5, 6, 7, 8], 4)],
        [AllBlocksCleared(), BlockRemoved([2])],
    ]


@pytest.mark.parametrize(
    ("windows", "host_blocks"),
    [((2048,), 0), ((512, 2048), 4)],
    ids=["evictions", "host-level-and-sliding-window"],
)
def test_a_router_rebuilds_what_the_llm_apis_cache_holds_from_the_published_events(
    fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, windows, host_blocks
) -> None:
    """Requests through the model fill a 10-block KV cache, which evicts (to its host level, when
    it has one, and out of it); a pyzmq subscriber that applies the published batches as a
    router does holds exactly the full blocks of the fake's cache (largest window) at the end."""
    import random

    from kv_event_subscriber import BlockIndex, free_endpoint

    from tests.waiting import wait_for

    fake.kv_window_sizes, fake.kv_host_blocks = windows, host_blocks
    endpoint = free_endpoint()
    monkeypatch.setenv("TRTLLM_KV_EVENTS_ENDPOINT", endpoint)
    config = {"tokens_per_block": 4, "max_tokens": 40}
    started = serve(monkeypatch, tmp_path, kv_cache_config=config)
    try:
        (llm,) = fake.llms
        with BlockIndex(endpoint, block_size=4) as index:
            publisher = started.engine._events  # the engine's publisher: probe the subscription
            assert wait_for(
                lambda: index.heard(lambda: publisher.publish([AllBlocksCleared()])), 10
            )
            rng = random.Random(5)
            prefixes = [[rng.randrange(1, 100) for _ in range(10)] for _ in range(4)]
            for _ in range(40):
                prompt = rng.choice(prefixes) + [
                    rng.randrange(1, 100) for _ in range(rng.randrange(8))
                ]
                request = harness.token_request(prompt, sampling_param_max_tokens=1 + rng.randrange(3),
                                                sampling_param_exclude_input_from_output=True)  # fmt: skip
                started.execute([request])
                request.wait()
            held = {h for h, tokens in llm.kv_caches[max(windows)].held().items() if tokens == 4}
            assert held, "the workload stored nothing"
            assert wait_for(lambda: index.drain() == held, 10), (index.held, held)
        # The workload did what it is for: evictions, of partial blocks too (never published).
        log = [event["data"] for event in llm.kv_event_log]
        partial = {block["block_hash"] for data in log if data["type"] == "stored"
                   for block in data["blocks"] if len(block["tokens"]) < 4}  # fmt: skip
        gone = {h for data in log if data["type"] == "removed" for h in data["block_hashes"]}
        assert index.events["BlockRemoved"] and partial & gone
        assert any(data["type"] == "updated" for data in log) == bool(host_blocks)
    finally:
        started.finalize()


def serve_with_events(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **kv_cache_config):
    """The model publishing its KV-cache events, and the endpoint they go to."""
    from kv_event_subscriber import free_endpoint

    endpoint = free_endpoint()
    monkeypatch.setenv("TRTLLM_KV_EVENTS_ENDPOINT", endpoint)
    return serve(monkeypatch, tmp_path, kv_cache_config=kv_cache_config), endpoint


@contextlib.contextmanager
def subscribed(started, endpoint: str, block_size: int) -> Iterator:
    """A router's view of the model's events (a BlockIndex), once its subscription is in place."""
    from kv_event_subscriber import BlockIndex

    from tests.waiting import wait_for

    with BlockIndex(endpoint, block_size=block_size) as index:
        publisher = started.engine._events  # the engine's publisher: probe the subscription
        assert wait_for(lambda: index.heard(lambda: publisher.publish([AllBlocksCleared()])), 10)
        yield index


def run_requests(started, prompts: list[list[int]], max_tokens: int) -> None:
    """The prompts as requests sent together, waited for."""
    requests = [
        harness.token_request(
            prompt,
            sampling_param_max_tokens=max_tokens,
            sampling_param_exclude_input_from_output=True,
        )
        for prompt in prompts
    ]
    started.execute(requests)
    for request in requests:
        request.wait()


def full_blocks(llm, block_size: int) -> set[int]:
    """What the fake's cache (its largest window) holds in full blocks."""
    return {h for h, n in llm.kv_caches[max(llm.kv_caches)].held().items() if n == block_size}


def test_after_dropped_events_a_router_rebuilds_the_llm_apis_cache_from_what_follows(
    fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Long requests finish while the LLM API's iterator has ended (no event for its timeout):
    more events than event_buffer_max_size wait, and the oldest, evictions of blocks a router
    was told of, are dropped. The next request re-opens the iterator; the bridge publishes
    AllBlocksCleared, warns once, and goes on, so once later requests have evicted what the cache
    held before the gap, the router's view is again exactly the cache's full blocks."""
    from tests.waiting import wait_for

    started, endpoint = serve_with_events(
        monkeypatch, tmp_path, tokens_per_block=4, max_tokens=40, event_buffer_max_size=2
    )
    trtllm = type(started.engine).__module__
    wait_s = importlib.import_module(trtllm).KV_EVENT_WAIT_S
    try:
        (llm,) = fake.llms
        with subscribed(started, endpoint, 4) as index, caplog.at_level(logging.WARNING):
            # The bridge's reads end 50 ms after the last event, until the next request.
            monkeypatch.setattr(f"{trtllm}.KV_EVENT_WAIT_S", 0.05)
            run_requests(started, [[100 + t for t in range(10)]], 1)
            run_requests(started, [[150 + t for t in range(10)]], 1)
            assert wait_for(lambda: index.drain() == full_blocks(llm, 4), 10)
            monkeypatch.setattr(fake, "step_s", 0.02)  # 20 tokens: 0.4 s without an event
            run_requests(started, [[1 + i] * 10 for i in range(4)], 20)
            assert llm.kv_events_dropped > 0
            monkeypatch.setattr(f"{trtllm}.KV_EVENT_WAIT_S", wait_s)
            monkeypatch.setattr(fake, "step_s", 0.001)
            rng = random.Random(7)
            prefixes = [[rng.randrange(200, 300) for _ in range(10)] for _ in range(4)]
            for _ in range(40):
                suffix = [rng.randrange(200, 300) for _ in range(rng.randrange(8))]
                run_requests(started, [rng.choice(prefixes) + suffix], 1 + rng.randrange(3))
            held = full_blocks(llm, 4)
            assert wait_for(lambda: index.drain() == held, 10), (index.held, held)
        kinds = [event["type"] for event in index.log]
        assert "AllBlocksCleared" in kinds[kinds.index("BlockStored") :]
        warnings = [r.getMessage() for r in caplog.records if "were dropped" in r.getMessage()]
        assert len(warnings) == 1 and "event_buffer_max_size (2)" in warnings[0], warnings
    finally:
        started.finalize()


def test_an_eviction_long_after_the_last_request_went_in_is_still_published(
    fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The LLM API's iterator ends after its timeout without an event and yields nothing more
    until the next generate_async. A request that runs half a second without an event (past a
    short read timeout) and evicts blocks as it finishes, with no request after it, still
    reaches the router within seconds."""
    from tests.waiting import wait_for

    started, endpoint = serve_with_events(monkeypatch, tmp_path, tokens_per_block=4, max_tokens=40)
    try:
        (llm,) = fake.llms
        with subscribed(started, endpoint, 4) as index:
            for prefix in range(5):  # 3 blocks each: the 10-block cache is full
                run_requests(started, [[100 * prefix + t for t in range(1, 13)]], 1)
            assert wait_for(lambda: index.drain() == full_blocks(llm, 4), 10)
            monkeypatch.setattr(fake, "step_s", 0.025)  # 20 tokens: 0.5 s without an event
            before = len(llm.kv_event_log)
            run_requests(started, [list(range(600, 612))], 20)
            assert {"stored", "removed"} <= {e["data"]["type"] for e in llm.kv_event_log[before:]}
            held = full_blocks(llm, 4)
            assert wait_for(lambda: index.drain() == held, 5), (index.held, held)
    finally:
        started.finalize()


def png(size: tuple[int, int], mode: str = "RGB") -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, "PNG")
    return buffer.getvalue()


def image_request(prompt, images: list[bytes], **sampling):
    """An EngineRequest carrying encoded images."""
    from tensorrtllm_backend.python_models.llmapi import engine

    return engine.EngineRequest(prompt, engine.Sampling(max_tokens=1, **sampling), images=images)


def generate(model, request) -> list:
    """Run one request on the model's engine, on its loop (as the model does)."""

    async def steps() -> list:
        return [step async for step in model.engine.generate(request)]

    return asyncio.run_coroutine_threadsafe(steps(), model.loop).result(10)


@pytest.fixture
def vlm(fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The model over a vision-language checkpoint (a multimodal input processor)."""
    fake.multimodal = True
    started = serve(monkeypatch, tmp_path / "vlm")
    yield started
    started.finalize()


def test_images_go_as_multi_modal_data_beside_the_prompt(vlm, fake) -> None:
    """A text or token-id prompt with images becomes a TextPrompt / TokensPrompt dict whose
    multi_modal_data holds them as RGB PIL images, in order; the prompt goes as sent (its
    placeholders unexpanded: the model's input processor expands them)."""
    from PIL import Image

    text = "<|vision_start|><|image_pad|><|vision_end|>" * 2 + "What is this?"
    steps = generate(vlm, image_request(text, [png((4, 3)), png((2, 5), "RGBA")]))
    assert steps[-1].finished
    inputs = fake.calls[-1]["inputs"]
    assert set(inputs) == {"prompt", "multi_modal_data"} and inputs["prompt"] == text
    images = inputs["multi_modal_data"]["image"]
    assert all(isinstance(image, Image.Image) and image.mode == "RGB" for image in images)
    assert [image.size for image in images] == [(4, 3), (2, 5)]
    generate(vlm, image_request([1, 151652, 151655, 151653, 9], [png((4, 3))]))
    inputs = fake.calls[-1]["inputs"]
    assert set(inputs) == {"prompt_token_ids", "multi_modal_data"}
    assert inputs["prompt_token_ids"] == [1, 151652, 151655, 151653, 9]
    assert len(inputs["multi_modal_data"]["image"]) == 1
    generate(vlm, image_request([4], []))  # no images: the plain token prompt
    assert fake.calls[-1]["inputs"] == {"prompt_token_ids": [4]}


def test_images_a_model_cannot_take_are_refused(model, vlm, fake) -> None:
    """A text-only model (whose LLM API would drop them), prompt scores (the engine's prompt
    holds the images' feature tokens) and undecodable bytes: the request's error."""
    from tensorrtllm_backend.python_models.request_error import RequestError

    with pytest.raises(RequestError, match="takes no images"):
        generate(model, image_request("<image>Hi", [png((4, 3))]))
    with pytest.raises(RequestError, match="prompt log probs"):
        generate(vlm, image_request("<image>Hi", [png((4, 3))], prompt_logprobs=0))
    with pytest.raises(RequestError, match="not a PNG, JPEG, WEBP or GIF image"):
        generate(vlm, image_request("<image>Hi", [b"not an image"]))
    assert fake.calls == []


def test_a_modelopt_checkpoint_reaches_the_llm_as_its_own_directory(
    fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A ModelOpt checkpoint exported here, packed with --workflow llmapi --checkpoint: the LLM
    gets its directory and nothing else about its quantization. TensorRT-LLM's PyTorch backend
    reads hf_quant_config.json itself (ModelConfig.from_pretrained), and kv_cache_config.dtype
    "auto" (its default) follows the checkpoint's kv_cache_quant_algo; quant_config is no
    TorchLlmArgs field (../shared/contract/TRTLLM_LLMAPI.md, "Quantized checkpoints")."""
    import json
    import shutil

    import bentoml

    import pack_model
    from tensorrtllm_backend.triton.localize import localize_model_yaml
    from tests.quantized_reference import quantized_demo

    exported = quantized_demo(tmp_path / "quantized", "fp8", kv_cache="fp8").checkpoint
    name = "t-llmapi-modelopt-fp8"
    args = ["--workflow", "llmapi", "--checkpoint", str(exported), "--name", name]
    assert pack_model.main([*args, "--no-progress"]) == 0
    (stored,) = bentoml.models.list(name)
    try:
        repository = shutil.copytree(Path(stored.path) / "model_repository", tmp_path / "repo")
        localize_model_yaml(repository, Path(stored.path))
        model = harness.start_model(
            harness.model_module(monkeypatch), repository / "tensorrt_llm" / "1"
        )
        (llm,) = fake.llms
        quantization = json.loads((Path(llm.args["model"]) / "hf_quant_config.json").read_text())
        assert quantization["quantization"]["quant_algo"] == "FP8"
        assert quantization["quantization"]["kv_cache_quant_algo"] == "FP8"
        assert "quant_config" not in llm.args
        assert "dtype" not in (llm.args.get("kv_cache_config") or {})  # "auto": the checkpoint's
        model.finalize()
    finally:
        bentoml.models.delete(str(stored.tag))


def test_quant_config_is_no_argument_of_the_pytorch_llm(fake, monkeypatch, tmp_path) -> None:
    """TorchLlmArgs keeps quant_config private (it is TrtLlmArgs', the engine builder's): a
    model.yaml that sets it fails the load, as LLM(...) would."""
    with pytest.raises(ValueError, match="invalid argument.*quant_config"):
        serve(monkeypatch, tmp_path, quant_config={"quant_algo": "FP8"})
