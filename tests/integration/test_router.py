"""Replicas of the service behind vllm-router, unmodified (scripts/install-router.sh puts it in
.router-venv/; scripts/test.sh runs that): two `bentoml serve` replicas of the demo model, the
router in front, and the official `openai` client talking to the router only.

- `round_robin`: completions and chat completions, streamed and whole, come back through the
  router, and the requests are spread over both replicas (each replica's own request counters).
- `kv_aware`: conversations go to the replica that holds their prefix. The router mirrors each
  replica's KV cache from the events it publishes (TRTLLM_KV_EVENTS_ENDPOINT, vLLM's ZMQ +
  msgpack format) and asks the replica's /tokenize for a request's token ids; the first turn of
  each conversation is sent to a chosen replica directly, the later turns through the router.
  The same conversations through `round_robin` in front of the same replicas are the baseline:
  about half their follow-ups find their prefix.

What the router needs from a worker: GET /health (200 before it starts routing), the OpenAI
routes, and /tokenize for kv_aware (docs/gpu.md, "Behind a router: vllm-router").
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from math import comb
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
# Each follow-up adds more than two blocks to its conversation (with the answer before it), so
# that a replica that served an older turn holds less of it than the one that served the last.
FOLLOW_UP = (
    "And after that, part {turn}: what did the tide do to the boats, what did the keeper write "
    "in his log, and were the lamps on the old stone bridge lit?"
)
ANSWER_TOKENS = 8
CONVERSATIONS = 16  # even: half start on each replica
TURNS = 4


@pytest.fixture(scope="module")
def reuse_model() -> str:
    """The demo model with the engine's prefix cache on, in blocks of KV_BLOCK_SIZE tokens."""
    return pack(
        "--demo", "--name", REUSE_MODEL, "--max-input-len", "512", "--max-seq-len", "640",
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


@pytest.fixture(scope="module")
def kv_round_robin(
    kv_replicas: list[BentoServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Router]:
    """Round robin in front of kv_aware's replicas: the baseline kv_aware is measured against."""
    router = start_router(kv_replicas, "round_robin", tmp_path_factory.mktemp("router"))
    yield router
    router.stop()


def follow_ups_on_holder(
    router: Router, replicas: list[BentoServer], first: int, order: random.Random
) -> list[bool]:
    """Runs CONVERSATIONS conversations, numbered from `first`, and says of each follow-up
    whether it landed on the holder of its prefix.

    Each first turn is served by a chosen replica directly (even conversations by the first, odd
    ones by the second). Then come TURNS - 1 rounds of follow-ups through `router`, one request
    at a time, each round in an order drawn from `order` (people answer when they do). A
    follow-up's holder is the replica that served its conversation's previous turn: the only one
    whose cached prompt tokens cover that turn's prompt (its full blocks, less one for slack)."""
    direct = [
        openai.OpenAI(
            base_url=f"{replica.url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
        )
        for replica in replicas
    ]
    conversations: list[list[ChatCompletionMessageParam]] = []
    prompts: list[list[int]] = []  # each conversation's prompt tokens, turn by turn
    for index in range(first, first + CONVERSATIONS):
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": OPENING.format(index=index)},
            {"role": "user", "content": "What did the keeper see tonight?"},
        ]
        answer = direct[index % 2].chat.completions.create(
            model=REUSE_MODEL, messages=messages, max_tokens=ANSWER_TOKENS, temperature=0
        )
        assert answer.usage is not None
        messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
        conversations.append(messages)
        prompts.append([answer.usage.prompt_tokens])
    # Long enough that the other replica holds only the chat template's first tokens of it.
    assert min(tokens[0] for tokens in prompts) >= 4 * KV_BLOCK_SIZE, prompts

    client = router.client()
    on_holder: list[bool] = []
    for turn in range(1, TURNS):
        for index in order.sample(range(CONVERSATIONS), CONVERSATIONS):
            messages = conversations[index]
            messages.append({"role": "user", "content": FOLLOW_UP.format(turn=turn)})
            answer = client.chat.completions.create(
                model=REUSE_MODEL, messages=messages, max_tokens=ANSWER_TOKENS, temperature=0
            )
            assert answer.usage is not None
            messages.append(
                {"role": "assistant", "content": answer.choices[0].message.content or ""}
            )
            details = answer.usage.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details is not None else 0
            held = prompts[index][-1] // KV_BLOCK_SIZE * KV_BLOCK_SIZE
            on_holder.append(cached >= held - KV_BLOCK_SIZE)
            prompts[index].append(answer.usage.prompt_tokens)
    # A replica that served an older turn holds at most that prompt and its answer: two blocks
    # short of the last prompt's, so it never passes for the holder.
    growth = min(later - earlier for tokens in prompts for earlier, later in pairwise(tokens))
    assert growth >= 2 * KV_BLOCK_SIZE + ANSWER_TOKENS, prompts
    return on_holder


def round_robin_band(conversations: int, rounds: int, tail: float) -> tuple[int, int]:
    """The band that round robin's count of follow-ups on their holder stays in, but for a chance
    of `tail`, over 2 replicas and `rounds` rounds of an even number of `conversations` in a
    random order each.

    vllm-router's round robin sends the k-th request it routes to replica k mod 2 (in its own
    order of the two), blind to what the request holds. Each round puts half its follow-ups on
    each replica, and each replica holds half the conversations (the first turns by choice, the
    later ones by round robin's last round). With X of the first replica's conversations among
    the follow-ups it gets, 2X follow-ups land on their holder: X is hypergeometric, and the
    rounds' orders are independent, so the count is twice a sum of `rounds` such X."""
    half = conversations // 2
    one = [
        comb(half, x) * comb(half, half - x) / comb(conversations, half) for x in range(half + 1)
    ]
    total = [1.0]
    for _ in range(rounds):
        total = [
            sum(p * one[s - i] for i, p in enumerate(total) if 0 <= s - i <= half)
            for s in range(len(total) + half)
        ]
    low, below = 0, 0.0  # symmetric: as likely below `low` as above the mirror of it
    while below + total[low] <= tail / 2:
        below += total[low]
        low += 1
    return 2 * low, 2 * (len(total) - 1 - low)


def test_kv_aware_sends_a_conversation_where_its_prefix_is(
    kv_aware: Router, kv_round_robin: Router, kv_replicas: list[BentoServer]
) -> None:
    """The same kind of conversations through kv_aware, then through round robin, in front of
    the same two replicas (each its own conversations: the caches hold the others'). At least
    90 % of kv_aware's follow-ups must land on the holder of their prefix, against about half of
    round robin's: a measured baseline.

    Each round goes in a random order because round robin alternates: in a fixed order, with an
    even number of conversations, all of a conversation's follow-ups land on one replica, so
    round robin would find every prefix (that replica served its first turn) or all but the
    first round's. In a random order it finds 2X a round (round_robin_band): of 48 follow-ups
    (16 conversations, 3 rounds), 10 to 38 (21 to 79 %) but for a chance of 1.2e-5, close to
    binomial(48, 1/2)'s 99.99 % interval, 11 to 37. kv_aware's 90 % is 44."""
    seed = random.randrange(2**32)
    order = random.Random(seed)
    before = [requests_served(replica).get("openai_chat", 0.0) for replica in kv_replicas]
    kv = follow_ups_on_holder(kv_aware, kv_replicas, 0, order)
    # Both replicas served follow-ups (less the first turns, half on each): kv_aware did not just
    # pick one.
    served = [
        requests_served(replica).get("openai_chat", 0.0) - then - CONVERSATIONS / 2
        for replica, then in zip(kv_replicas, before, strict=True)
    ]
    baseline = follow_ups_on_holder(kv_round_robin, kv_replicas, CONVERSATIONS, order)
    low, high = round_robin_band(CONVERSATIONS, TURNS - 1, 1e-4)
    seen = (
        f"on their prefix's holder: kv_aware {sum(kv)}, round_robin {sum(baseline)} of "
        f"{len(kv)} follow-ups each (round robin's band {low} to {high}; order seed {seed})"
    )
    print(seen, file=sys.stderr)
    assert sum(kv) >= 0.9 * len(kv), seen
    assert low <= sum(baseline) <= high and sum(baseline) < sum(kv), seen
    assert min(served) >= 0.4 * len(kv), served
    assert all(health_status(replica.url) == 200 for replica in kv_replicas)
