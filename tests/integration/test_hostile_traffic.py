"""Hostile and careless clients against a real `bentoml serve`: huge requests do not stall the
other streams of the worker, and every request whose client goes away is cancelled, in the
service and in the engine."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
import psutil
import pytest

from tests.integration.conftest import engine_counters, pack, stop_and_reap
from tests.waiting import wait_for

if TYPE_CHECKING:
    from conftest import BentoServer  # tests/integration/conftest.py

pytestmark = pytest.mark.integration

MODEL = "trtllm-demo"
PROMPT = "Once upon a time"


# --- the event loop never blocks on request size --------------------------------------------------


def big_tools_body(size: int = 1_000_000) -> bytes:
    """A chat request with ~`size` bytes of tools, rendered into the prompt by the template."""
    tool = {
        "type": "function",
        "function": {
            "name": "",
            "description": "Look up the weather in a city, for a number of days " * 2,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
    one = len(json.dumps(tool)) + 8
    tools = [
        {**tool, "function": {**tool["function"], "name": f"tool_{i}"}} for i in range(size // one)
    ]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather?"}],
        "tools": tools,
        "tool_choice": "none",
        "max_tokens": 4,
    }
    return json.dumps(body).encode()


def big_prompt_body(size: int = 2_000_000) -> bytes:
    """A native request whose prompt is `size` bytes of UTF-8 (fewer characters than the
    prompt's character limit, so it is tokenized)."""
    prompt = ("Once upon a time, € " * (size // 22 + 1))[: size // 2]
    return json.dumps({"prompt": prompt, "max_tokens": 4}, ensure_ascii=False).encode()


def big_schema_body(size: int = 250_000) -> bytes:
    """A guided request whose JSON schema is ~`size` bytes: valid for the meta-schema (checked in
    full), refused by the compiler at once (a missing $ref), so nothing reaches the engine. Each
    one is new (the service remembers a refused guide for a minute)."""
    field = {"type": "integer", "description": f"{time.time_ns()}".ljust(40, "d")}
    count = size // (len(json.dumps(field)) + 14)
    schema = {
        "type": "object",
        "properties": {f"field_{i}": field for i in range(count)},
        "$ref": "#/$defs/missing",
    }
    guide = {"type": "json_schema", "guide": json.dumps(schema)}
    return json.dumps({"prompt": PROMPT, "max_tokens": 4, "guided_decoding": guide}).encode()


def big_scoring_body(prompts: int = 16, tokens: int = 250) -> bytes:
    """A completions batch that scores `prompts` prompts of `tokens` token ids with 5
    alternatives per position (evaluation traffic): accepted, and answered with ~25k log-prob
    entries (about a megabyte of JSON) rendered off the event loop."""
    batch = [[(7 * p + 3 * t) % 1500 + 10 for t in range(tokens)] for p in range(prompts)]
    body = {"model": MODEL, "prompt": batch, "echo": True, "logprobs": 5, "max_tokens": 0}
    return json.dumps(body).encode()


# (path, body maker, the status expected, a phrase of the answer)
BIG_REQUESTS = [
    ("/v1/chat/completions", big_tools_body, 400, "max_input_len"),
    ("/generate_text", big_prompt_body, 400, "max_input_len"),
    ("/generate_text", big_schema_body, 400, "does not compile"),
    ("/v1/completions", big_scoring_body, 200, "token_logprobs"),
]


def stream_gaps(url: str, stop: threading.Event) -> list[float]:
    """Inter-chunk gaps (seconds) of streams run one after another until `stop` is set; the gap
    before each stream's first chunk is not counted."""
    body = {"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    gaps: list[float] = []
    with httpx.Client(base_url=url, timeout=60) as client:
        while not stop.is_set():
            last = None
            with client.stream("POST", "/generate", json=body) as response:
                assert response.status_code == 200, response.read()
                for _ in response.iter_raw():
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
    return gaps


def largest_gap(
    url: str, seconds: float | None, load: Callable[[], Any] | None
) -> tuple[float, Any]:
    """The largest inter-token gap of streams running for `seconds`, or while `load` runs."""
    stop = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        streaming = pool.submit(stream_gaps, url, stop)
        time.sleep(0.5)  # the stream is under way
        result = None
        if load is not None:
            result = load()
        else:
            time.sleep(seconds or 0)
        stop.set()
        gaps = streaming.result(timeout=120)
    assert len(gaps) > 20, gaps
    return max(gaps), result


# Half the shortest stall the huge requests caused on the event loop (0.5 s), five times the
# scheduling noise of a loaded 2-core host (up to ~45 ms): a stall fails, noise does not.
STALL_BOUND_S = 0.25


def big_bodies() -> list[tuple[str, bytes, int, str]]:
    """(path, body, status, a phrase of the answer) of each huge request."""
    return [(path, make(), status, expect) for path, make, status, expect in BIG_REQUESTS]


def send_big_requests(url: str, bodies: list[tuple[str, bytes, int, str]]) -> None:
    """Send the huge requests one after another, as one client would, and check each is
    refused for its size (or, the scoring batch, answered)."""
    with httpx.Client(base_url=url, timeout=120) as client:
        for path, content, status, expect in bodies:
            assert len(content) >= 15_000
            response = client.post(
                path, content=content, headers={"content-type": "application/json"}
            )
            assert response.status_code == status, (path, response.status_code, response.text[:300])
            assert expect in response.text, (path, response.text[:300])


def test_huge_requests_do_not_stall_a_running_stream(demo_server: BentoServer) -> None:
    """The largest inter-token gap of a stream grows by less than STALL_BOUND_S while another
    client sends a 1 MB tools list, a 2 MB prompt and a 250 KB schema (each refused, after the
    work its size costs: parsing and rendering the tools, the meta-schema check), and a batch
    of prompts to score (answered: ~25k log-prob entries).

    Each attempt measures the same stream's largest gap with the huge requests, then for as long
    again without them. The development machine has two cores shared with other test runs,
    where a stray scheduling delay alone reached 50 ms in either window (25-45 ms gaps without
    any huge request, with a CPU hog beside the suite), and a 50 ms bound failed a run (53 ms):
    the bound sits between that noise and the stalls this guards against (0.5-6 s), and the
    claim holds when one of five attempts shows it. A loop that stalls on request size fails
    all five. The bodies are built before the stream starts, so that the test's own JSON
    encoding is not what it measures."""
    url = demo_server.url
    send_big_requests(url, big_bodies())  # once first: imports and caches warm on both sides
    growths = []
    for _ in range(5):
        bodies = big_bodies()  # a new schema each time: refused guides are remembered
        started = time.perf_counter()
        loaded, _ = largest_gap(url, None, lambda b=bodies: send_big_requests(url, b))
        quiet, _ = largest_gap(url, time.perf_counter() - started, None)
        growths.append((loaded - quiet, loaded, quiet))
        if loaded - quiet < STALL_BOUND_S:
            break
    growth, loaded, quiet = min(growths)
    assert growth < STALL_BOUND_S, [
        f"largest gap {g[1] * 1000:.0f} ms with the huge requests, {g[2] * 1000:.0f} ms without"
        for g in growths
    ]


# --- every request is cancelled when its client goes away -----------------------------------------


@pytest.fixture(scope="module")
def waiting_server(
    module_bento_launcher: Callable[..., BentoServer],
) -> Iterator[tuple[BentoServer, int]]:
    """The synthetic engine with a 3 s wait for the first token and 50 ms per token after it,
    its Triton metrics on a known port."""
    from tensorrtllm_backend.triton.command import find_free_port

    tag = pack(
        "--synthetic", "--name", "trtllm-waiting", "--ttft-ms", "3000", "--itl-ms", "50",
        "--max-input-len", "64", "--max-seq-len", "1024",
    )  # fmt: skip
    metrics_port = find_free_port()
    server = module_bento_launcher(
        tag, {"TRTLLM_TRITON_METRICS_PORT": str(metrics_port)}, wait=True
    )
    yield server, metrics_port
    stop_and_reap(server)


def in_flight(server: BentoServer) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    values = re.findall(r"^trtllm_requests_in_flight(?:\{[^}]*\})? (\S+)$", text, re.M)
    return sum(float(value) for value in values)


LONG = {"prompt": PROMPT, "max_tokens": 500, "ignore_eos": True}
CHAT = {"model": "trtllm-waiting", "messages": [{"role": "user", "content": "hi"}], **LONG}
DISCONNECTS = [
    ("native-stream-before-first-token", "/generate", LONG, 0),
    ("native-stream-after-first-token", "/generate", LONG, 3),
    ("native-not-streamed", "/generate_text", LONG, 0),
    ("openai-not-streamed", "/v1/completions", {"model": "trtllm-waiting", **LONG}, 0),
    ("openai-stream-before-first-token", "/v1/chat/completions", {**CHAT, "stream": True}, 0),
    ("openai-stream-after-first-token", "/v1/chat/completions", {**CHAT, "stream": True}, 3),
]


def leave_after(url: str, path: str, body: dict[str, Any], chunks: int, ready: Callable[[], bool]):
    """Send a request on a raw connection and close it after `chunks` pieces of the streamed
    body, or (chunks == 0) as soon as `ready()` says it is being generated: a client that goes
    away before any answer, which an HTTP client library cannot do mid-wait."""
    host, port = url.rsplit("/", 1)[-1].split(":")
    content = json.dumps(body).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(content)}\r\n\r\n"
    ).encode() + content
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(request)
        if chunks:
            received = b""
            while (
                received.count(b"\r\n\r\n") < 1
                or len(received.split(b"\r\n\r\n", 1)[1]) < chunks * 8
            ):
                data = connection.recv(65536)
                assert data, received
                received += data
            assert received.startswith(b"HTTP/1.1 200"), received[:300]
        else:
            deadline = time.monotonic() + 10
            while not ready() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert ready(), "the request never started generating"
    return time.monotonic()


@pytest.mark.parametrize(
    ("path", "body", "chunks"), [d[1:] for d in DISCONNECTS], ids=[d[0] for d in DISCONNECTS]
)
def test_a_client_that_leaves_cancels_its_request(waiting_server, path, body, chunks) -> None:
    """The client leaves while its request waits for the first token (or after a few chunks):
    the in-flight gauge is back to 0, and the engine counts the request cancelled. The wait
    for the gauge allows 10 s, however loaded the host: a request nobody cancelled stays in
    flight for 28 s (its 3 s first token, then 500 tokens at 50 ms)."""
    server, metrics_port = waiting_server
    before = engine_counters(metrics_port)["trtllm_cpu_engine_cancelled_requests_total"]
    left_at = leave_after(server.url, path, body, chunks, lambda: in_flight(server) >= 1)
    while in_flight(server) > 0 and time.monotonic() - left_at < 10:
        time.sleep(0.02)
    gone_after = time.monotonic() - left_at
    assert in_flight(server) == 0, f"still in flight {gone_after:.2f} s after its client left"
    deadline = time.monotonic() + 5
    cancelled = before
    while cancelled <= before and time.monotonic() < deadline:
        cancelled = engine_counters(metrics_port)["trtllm_cpu_engine_cancelled_requests_total"]
        time.sleep(0.05)
    assert cancelled == before + 1, "the engine did not report the request cancelled"
    counters = engine_counters(metrics_port)
    assert counters["trtllm_cpu_engine_active_requests"] == 0


def test_a_client_that_leaves_while_sending_is_answered(waiting_server) -> None:
    """A client that closes its connection halfway through its body: the request ends (the
    access log shows it, as a 499) instead of being held by BentoML's timeout middleware for
    ten minutes, which would also hold a stopping server."""
    server, _ = waiting_server
    host, port = server.url.rsplit("/", 1)[-1].split(":")
    content = json.dumps(LONG).encode()
    head = (
        f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(content)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(head + content[: len(content) // 2])
    answered = re.compile(r"path=/generate,type=application/json,length=\d+\) \(status=499")
    assert wait_for(lambda: answered.search(server.log()), 10), server.log()[-3000:]


def test_a_server_whose_clients_left_stops_at_once(waiting_server) -> None:
    """Runs last in this module: it stops the module's server. After clients that left (the
    tests above, and one more here before its first token), SIGTERM of `bentoml serve` ends it
    within seconds: no request of a departed client is still held open, and tritonserver, which
    gets the same signal from BentoML's process manager, is not restarted on the way out."""
    server, _ = waiting_server
    leave_after(server.url, "/generate_text", LONG, 0, lambda: in_flight(server) >= 1)
    assert wait_for(lambda: in_flight(server) == 0, 5)
    tritons = server.tritons()
    started = time.monotonic()
    server.stop(timeout=60)
    assert server.process.returncode is not None
    # A request still held open would keep its worker until BentoML's 30 s grace ran out.
    stopped_after = time.monotonic() - started
    assert stopped_after < 25, f"bentoml serve took {stopped_after:.0f} s to stop after SIGTERM"
    assert psutil.wait_procs(tritons, timeout=10)[1] == []
    log = server.log()
    assert "exited unexpectedly" not in log and "restarting tritonserver" not in log, log[-3000:]
