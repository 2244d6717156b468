"""Replicas of the service behind vllm-router, unmodified (scripts/install-router.sh puts it in
.router-venv/; scripts/test.sh runs that): two `bentoml serve` replicas of the demo model, the
router in front, and the official `openai` client talking to the router only.

- `round_robin`: completions and chat completions, streamed and whole, come back through the
  router, and the requests are spread over both replicas (each replica's own request counters).
- `kv_aware`: conversations go to the replica that holds their prefix. The router mirrors each
  replica's KV cache from the events it publishes (TRTLLM_KV_EVENTS_ENDPOINT, vLLM's ZMQ +
  msgpack format) and asks the replica's /tokenize for a request's token ids; the first turn of
  each conversation is sent to a chosen replica directly, the later turns through the router.

What the router needs from a worker: GET /health (200 before it starts routing), the OpenAI
routes, and /tokenize for kv_aware (docs/gpu.md, "Behind a router: vllm-router").
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tensorrtllm_backend.triton.command import find_free_port, with_death_signal
from tests.integration.conftest import health_status, pack, wait_until_ready
from tests.waiting import wait_for

if TYPE_CHECKING:
    from conftest import BentoServer  # tests/integration/conftest.py

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ROUTER = ROOT / ".router-venv" / "bin" / "vllm-router"
MODEL = "trtllm-demo"
REUSE_MODEL = "trtllm-demo-reuse"
TIMEOUT = 120.0
# The engine's KV block size (pack_model.py --tokens-per-block) and the router's
# --kv-event-block-size, which it cuts a request's token ids by to look its blocks up.
KV_BLOCK_SIZE = 16

if not ROUTER.exists():
    pytestmark = [
        pytest.mark.integration,
        pytest.mark.skip(
            reason=f"vllm-router is not installed ({ROUTER}): run scripts/install-router.sh"
        ),
    ]


@dataclass
class Router:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)

    def client(self) -> openai.OpenAI:
        # No retries: a retried 5xx would hide the failures the tests look for.
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
        )


def start_router(
    workers: list[BentoServer], policy: str, log_dir: Path, extra: tuple[str, ...] = ()
) -> Router:
    """vllm-router in front of `workers`, once it answers /readiness (it starts serving only
    after every worker's /health answered 200)."""
    port = find_free_port()
    log_path = log_dir / f"vllm-router-{port}.log"
    command = [
        str(ROUTER), "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
        "--worker-urls", *(worker.url for worker in workers),
        # Its defaults wait 30 s between checks of workers that are not up yet.
        "--worker-startup-timeout-secs", "120", "--worker-startup-check-interval", "1",
        # Each router its own metrics port: two at once would both take the default one.
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(find_free_port()),
        "--log-level", "info", *extra,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        # The router dies with the test process even when teardown never runs.
        process = subprocess.Popen(
            with_death_signal(command, signal.SIGTERM), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    router = Router(f"http://127.0.0.1:{port}", process, log_path)

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"vllm-router exited:\n{router.log()[-4000:]}")
        try:
            return httpx.get(f"{router.url}/readiness", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_for(ready, 120, 0.25), f"vllm-router not ready:\n{router.log()[-4000:]}"
    except BaseException:
        router.stop()
        raise
    return router


def requests_served(server: BentoServer) -> dict[str, float]:
    """Finished generations by API (`trtllm_requests_total`, summed over finish reasons)."""
    text = httpx.get(f"{server.url}/metrics", timeout=TIMEOUT).text
    served: dict[str, float] = {}
    for labels, value in re.findall(r"^trtllm_requests_total\{([^}]*)\} (\S+)$", text, re.M):
        api = re.search(r'api="([^"]*)"', labels)
        if api is not None:
            served[api.group(1)] = served.get(api.group(1), 0.0) + float(value)
    return served


def launch_replicas(
    launcher: Callable[..., BentoServer],
    model_tag: str,
    count: int,
    env: Callable[[int], dict[str, str]],
) -> list[BentoServer]:
    """`count` replicas started at once (their start-ups overlap), once all are ready."""
    replicas = [launcher(model_tag, env(index)) for index in range(count)]
    return [wait_until_ready(replica) for replica in replicas]


@pytest.fixture(scope="module")
def replicas(
    module_bento_launcher: Callable[..., BentoServer], demo_model: str
) -> list[BentoServer]:
    return launch_replicas(module_bento_launcher, demo_model, 2, lambda index: {})


@pytest.fixture(scope="module")
def round_robin(
    replicas: list[BentoServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Router]:
    router = start_router(replicas, "round_robin", tmp_path_factory.mktemp("router"))
    yield router
    router.stop()


def test_replicas_answer_the_routers_health_check(replicas: list[BentoServer]) -> None:
    for replica in replicas:
        response = httpx.get(f"{replica.url}/health", timeout=TIMEOUT)
        assert response.status_code == 200 and response.content == b""


def test_the_openai_client_through_the_router(round_robin: Router) -> None:
    client = round_robin.client()
    assert [model.id for model in client.models.list().data] == [MODEL]

    completion = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0
    )
    assert completion.choices[0].text and completion.usage is not None
    assert completion.usage.completion_tokens == 6

    chunks = list(
        client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, stream=True
        )
    )
    # Greedy, and both replicas serve the same weights: the stream says what the whole did.
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == (
        completion.choices[0].text
    )
    assert chunks[-1].choices[0].finish_reason == "length"

    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Hi there, who are you?"}
    ]
    chat = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=6,
        temperature=0,
    )
    assert chat.choices[0].message.content and chat.usage is not None
    assert chat.usage.completion_tokens == 6

    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    events = list(stream)
    text = "".join(event.choices[0].delta.content or "" for event in events if event.choices)
    assert text == chat.choices[0].message.content
    assert events[-1].usage is not None and events[-1].usage.completion_tokens == 6


def test_requests_reach_both_replicas(round_robin: Router, replicas: list[BentoServer]) -> None:
    before = [requests_served(replica).get("openai_chat", 0.0) for replica in replicas]
    client = round_robin.client()
    for turn in range(6):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Question {turn}?"}], max_tokens=2
        )

    def served() -> list[float]:
        counts = [requests_served(replica).get("openai_chat", 0.0) for replica in replicas]
        return [now - then for now, then in zip(counts, before, strict=True)]

    assert wait_for(lambda: served() == [3.0, 3.0], 10, 0.2), served()


# A conversation's fixed opening: several KV blocks long, and different from every other
# conversation's from its first block on (the index comes first), so that only the replica that
# served its first turn holds more of it than the chat template's first few tokens.
OPENING = (
    "Conversation {index}. You are its archivist: keep careful notes about the harbour, the "
    "lighthouse keeper, the fishing boats that leave before dawn, the weather over the cliffs, "
    "the market square and the old stone bridge, and answer every question briefly."
)
CONVERSATIONS = 8
TURNS = 3


@pytest.fixture(scope="module")
def reuse_model() -> str:
    """The demo model with the engine's prefix cache on, in blocks of KV_BLOCK_SIZE tokens."""
    return pack(
        "--demo", "--name", REUSE_MODEL, "--max-input-len", "256", "--max-seq-len", "512",
        "--enable-kv-cache-reuse", "true", "--tokens-per-block", str(KV_BLOCK_SIZE),
    )  # fmt: skip


@pytest.fixture(scope="module")
def kv_endpoints() -> list[str]:
    """Where each replica publishes its KV-cache events: a loopback port of its own."""
    return [f"tcp://127.0.0.1:{find_free_port()}" for _ in range(2)]


@pytest.fixture(scope="module")
def kv_replicas(
    module_bento_launcher: Callable[..., BentoServer], reuse_model: str, kv_endpoints: list[str]
) -> list[BentoServer]:
    return launch_replicas(
        module_bento_launcher, reuse_model, 2,
        lambda index: {"TRTLLM_KV_EVENTS_ENDPOINT": kv_endpoints[index]},
    )  # fmt: skip


@pytest.fixture(scope="module")
def kv_aware(
    kv_replicas: list[BentoServer], kv_endpoints: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Router]:  # fmt: skip
    sources: list[str] = []
    for replica, endpoint in zip(kv_replicas, kv_endpoints, strict=True):
        sources += ["--kv-event-source", f"{replica.url}={endpoint}"]
    router = start_router(
        kv_replicas, "kv_aware", tmp_path_factory.mktemp("router"),
        (*sources, "--kv-event-block-size", str(KV_BLOCK_SIZE), "--kv-event-model", REUSE_MODEL),
    )  # fmt: skip
    yield router
    router.stop()


def test_kv_aware_sends_a_conversation_where_its_prefix_is(
    kv_aware: Router, kv_replicas: list[BentoServer]
) -> None:
    """Each conversation's first turn is served by a chosen replica directly (half on each, so
    that a router that ignored the cache, and sent everything to one replica, would miss half);
    its later turns go through the router. At least 90 % of them must land on the replica that
    holds their prefix: the only one whose cached prompt tokens cover the first turn's prompt
    (its full blocks, less one for slack)."""
    direct = [
        openai.OpenAI(
            base_url=f"{replica.url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
        )
        for replica in kv_replicas
    ]
    conversations: list[list[ChatCompletionMessageParam]] = []
    held: list[int] = []  # the prompt tokens of each first turn, in full blocks
    for index in range(CONVERSATIONS):
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": OPENING.format(index=index)},
            {"role": "user", "content": "What did the keeper see tonight?"},
        ]
        answer = direct[index % 2].chat.completions.create(
            model=REUSE_MODEL, messages=messages, max_tokens=8, temperature=0
        )
        assert answer.usage is not None
        held.append(answer.usage.prompt_tokens // KV_BLOCK_SIZE * KV_BLOCK_SIZE)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
        conversations.append(messages)
    assert min(held) >= 4 * KV_BLOCK_SIZE, held  # long enough to tell the holder apart

    client = kv_aware.client()
    before = [requests_served(replica).get("openai_chat", 0.0) for replica in kv_replicas]
    cached: list[int] = []
    for turn in range(1, TURNS):
        for index, messages in enumerate(conversations):
            messages.append({"role": "user", "content": f"And after that, part {turn}?"})
            answer = client.chat.completions.create(
                model=REUSE_MODEL, messages=messages, max_tokens=8, temperature=0
            )
            messages.append(
                {"role": "assistant", "content": answer.choices[0].message.content or ""}
            )
            details = answer.usage.prompt_tokens_details if answer.usage else None
            reused = (details.cached_tokens or 0) if details is not None else 0
            cached.append(reused if reused >= held[index] - KV_BLOCK_SIZE else 0)
    hits = sum(1 for tokens in cached if tokens > 0)
    assert hits >= 0.9 * len(cached), f"{hits} of {len(cached)} follow-ups reused their prefix"
    # Both replicas served follow-ups: the router did not just pick one.
    served = [
        requests_served(replica).get("openai_chat", 0.0) - then
        for replica, then in zip(kv_replicas, before, strict=True)
    ]
    assert min(served) >= 0.4 * len(cached), served
    assert all(health_status(replica.url) == 200 for replica in kv_replicas)
