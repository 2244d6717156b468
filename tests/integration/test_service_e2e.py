"""The service end to end: a real `bentoml serve` of a packed model, its supervised tritonserver
and the CPU engine, driven through BentoML's own clients and plain HTTP."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from typing import TYPE_CHECKING

import bentoml
import httpx
import psutil
import pytest

if TYPE_CHECKING:
    from conftest import BentoServer  # tests/integration/conftest.py

from tests.integration.conftest import (
    counter_change,
    engine_counters,
    readyz_status,
    serves_requests,
    wait_counters,
)
from tests.waiting import wait_for_async

pytestmark = pytest.mark.integration

PROMPT = "Once upon a time"
APIS = ("generate", "generate_text")
LOAD_STREAMS = 64
LOAD_SECONDS = 5.0


def generate_text(server: BentoServer, **fields: object) -> dict:
    response = httpx.post(f"{server.url}/generate_text", json=fields, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def stream_text(server: BentoServer, **fields: object) -> list[str]:
    with bentoml.SyncHTTPClient(server.url, timeout=60) as client:
        return list(client.generate(**fields))


# --- the two APIs --------------------------------------------------------------------------------


def test_generate_streams_text_chunks(demo_server: BentoServer) -> None:
    chunks = stream_text(demo_server, prompt=PROMPT, max_tokens=24, temperature=0.0)
    assert len(chunks) > 1, "a 24-token completion should arrive in several chunks"
    assert all(isinstance(chunk, str) for chunk in chunks)
    assert "".join(chunks).strip()
    # The body is the text itself, and its content type says so (not server-sent events).
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0.0}
    with httpx.stream("POST", f"{demo_server.url}/generate", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/plain; charset=utf-8"
        assert response.read().decode() == "".join(chunks)


def test_generate_text_returns_text_usage_and_finish_reason(demo_server: BentoServer) -> None:
    result = generate_text(demo_server, prompt=PROMPT, max_tokens=16, temperature=0.0)
    assert set(result) >= {"text", "usage", "finish_reason"}
    assert result["text"]
    usage = result["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if result["finish_reason"] == "length":
        assert usage["completion_tokens"] == 16
    else:
        assert result["finish_reason"] == "stop" and usage["completion_tokens"] <= 16


def test_bentoml_client_decodes_generate_text(demo_server: BentoServer) -> None:
    """BentoML's own client decodes the JSON answer against the service's published schema."""
    with bentoml.SyncHTTPClient(demo_server.url, timeout=60) as client:
        result = client.generate_text(prompt=PROMPT, max_tokens=8, ignore_eos=True)
    assert result["usage"]["completion_tokens"] == 8
    assert result["finish_reason"] == "length"


def test_ignore_eos_runs_to_max_tokens(demo_server: BentoServer) -> None:
    result = generate_text(demo_server, prompt=PROMPT, max_tokens=40, ignore_eos=True)
    assert result["finish_reason"] == "length"
    assert result["usage"]["completion_tokens"] == 40


def test_streaming_equals_non_streaming_for_greedy(demo_server: BentoServer) -> None:
    fields = {"prompt": "The little robot", "max_tokens": 48, "temperature": 0.0}
    streamed = "".join(stream_text(demo_server, **fields))
    assert streamed == generate_text(demo_server, **fields)["text"]


def test_stop_word_ends_output_and_is_not_returned(demo_server: BentoServer) -> None:
    fields = {"prompt": PROMPT, "max_tokens": 64, "temperature": 0.0, "ignore_eos": True}
    full = generate_text(demo_server, **fields)["text"]
    # A stop string from the middle of the greedy output: a plain word seen after a few tokens.
    words = [m for m in re.finditer(r"[A-Za-z]{3,}", full) if m.start() >= 8]
    assert words, f"no plain word in the greedy output to stop on: {full!r}"
    stop = words[0].group()
    cut = full.index(stop)
    stopped = generate_text(demo_server, **fields, stop=[stop])
    assert stopped["finish_reason"] == "stop"
    assert stop not in stopped["text"]
    assert stopped["text"] == full[:cut]
    assert stopped["usage"]["completion_tokens"] < 64
    streamed = "".join(stream_text(demo_server, **fields, stop=[stop]))
    assert streamed == full[:cut]


def test_seeded_sampling_is_reproducible(demo_server: BentoServer) -> None:
    fields = {"prompt": PROMPT, "max_tokens": 24, "temperature": 1.0, "top_k": 50, "seed": 7}
    assert (
        generate_text(demo_server, **fields)["text"] == generate_text(demo_server, **fields)["text"]
    )


# --- bad input: HTTP 400 naming the limit, on both APIs; the server keeps serving ---------------


LIMIT_ERRORS = [
    pytest.param({"prompt": "word " * 400, "max_tokens": 4}, "max_input_len", id="prompt-too-long"),
    pytest.param({"prompt": PROMPT, "max_tokens": 600}, "max_seq_len", id="max-tokens-too-many"),
    pytest.param({"prompt": PROMPT, "beam_width": 2}, "max_beam_width", id="beam-width"),
    pytest.param({"prompt": PROMPT, "temperature": -1}, "temperature", id="temperature-negative"),
    pytest.param({"prompt": PROMPT, "top_p": 0}, "top_p", id="top-p-zero"),
    pytest.param({"prompt": PROMPT, "top_p": 1.5}, "top_p", id="top-p-above-one"),
    pytest.param({"prompt": ""}, "prompt", id="empty-prompt"),
    pytest.param({"prompt": "   "}, "prompt", id="blank-prompt"),
    pytest.param({"max_tokens": 4}, "prompt", id="missing-prompt"),
    pytest.param({"prompt": 42}, "prompt", id="prompt-not-a-string"),
    pytest.param({"prompt": PROMPT, "max_tokens": "many"}, "max_tokens", id="max-tokens-not-int"),
    pytest.param({"prompt": PROMPT, "max_tokens": 0}, "max_tokens", id="max-tokens-zero"),
    pytest.param({"prompt": PROMPT, "no_such_param": 1}, "no_such_param", id="unknown-field"),
]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(("body", "named"), LIMIT_ERRORS)
def test_bad_request_is_400_naming_the_problem(
    demo_server: BentoServer, api: str, body: dict, named: str
) -> None:
    response = httpx.post(f"{demo_server.url}/{api}", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert named in response.text
    assert "Traceback" not in response.text


@pytest.mark.parametrize("api", APIS)
def test_malformed_json_is_400(demo_server: BentoServer, api: str) -> None:
    response = httpx.post(
        f"{demo_server.url}/{api}",
        content=b'{"prompt": "unterminated',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    assert "json" in response.text.lower()


@pytest.mark.parametrize("api", APIS)
def test_error_body_is_a_json_object(demo_server: BentoServer, api: str) -> None:
    """Both APIs answer an engine-limit error with the same shape: {"error": "..."}. (BentoML
    alone would send the streaming API's as a JSON list: errors.NativeErrorMiddleware.)"""
    response = httpx.post(
        f"{demo_server.url}/{api}", json={"prompt": PROMPT, "beam_width": 2}, timeout=30
    )
    assert response.status_code == 400
    body = response.json()
    assert isinstance(body, dict), f"/{api} error body is {type(body).__name__}: {body!r}"
    assert "max_beam_width" in body["error"]


def test_server_still_answers_after_bad_requests(demo_server: BentoServer) -> None:
    for api in APIS:
        httpx.post(f"{demo_server.url}/{api}", content=b"{", timeout=30)
        httpx.post(f"{demo_server.url}/{api}", json={"prompt": PROMPT, "beam_width": 9}, timeout=30)
    result = generate_text(demo_server, prompt=PROMPT, max_tokens=8, ignore_eos=True)
    assert result["usage"]["completion_tokens"] == 8
    assert httpx.get(f"{demo_server.url}/readyz", timeout=10).status_code == 200


# --- a dedicated synthetic server: load, cancellation, shutdown ---------------------------------


async def test_twenty_concurrent_streams_complete(synthetic_metrics_server) -> None:
    server, metrics_port = synthetic_metrics_server
    before = engine_counters(metrics_port)
    async with bentoml.AsyncHTTPClient(server.url, timeout=120) as client:

        async def one(i: int) -> str:
            chunks = [c async for c in client.generate(
                prompt=f"request {i}", max_tokens=32, ignore_eos=True)]  # fmt: skip
            return "".join(chunks)

        texts = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(20))), 90)
    assert len(texts) == 20 and all(texts)
    assert len(set(texts)) > 1  # different prompts, different synthetic tokens
    after = wait_counters(
        metrics_port,
        lambda c: (
            c["trtllm_cpu_engine_finished_requests_total"]
            >= before["trtllm_cpu_engine_finished_requests_total"] + 20
        ),
    )
    change = counter_change(before, after)
    assert change["trtllm_cpu_engine_finished_requests_total"] == 20
    assert change["trtllm_cpu_engine_generated_tokens_total"] == 20 * 32


def test_client_disconnect_cancels_the_engine_request(synthetic_metrics_server) -> None:
    server, metrics_port = synthetic_metrics_server
    before = wait_counters(
        metrics_port, lambda c: c.get("trtllm_cpu_engine_active_requests", 1) == 0
    )
    body = {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{server.url}/generate", json=body) as response:
            assert response.status_code == 200
            first = next(response.iter_raw())
            assert first
        # leaving the block closes the connection mid-stream (400 tokens take >= 0.8 s here)
    key_cancelled = "trtllm_cpu_engine_cancelled_requests_total"
    after = wait_counters(metrics_port, lambda c: c[key_cancelled] > before[key_cancelled])
    change = counter_change(before, after)
    assert change[key_cancelled] == 1, after
    assert change["trtllm_cpu_engine_finished_requests_total"] == 0
    assert 0 < change["trtllm_cpu_engine_generated_tokens_total"] < 400
    assert (
        wait_counters(metrics_port, lambda c: c["trtllm_cpu_engine_active_requests"] == 0)[
            "trtllm_cpu_engine_active_requests"
        ]
        == 0
    )


async def test_readyz_stays_200_while_the_service_is_loaded(synthetic_metrics_server) -> None:
    """64 streams at once keep this 2-core host busy; /readyz, polled every 100 ms meanwhile,
    answers 200 every time: a loaded, healthy replica stays in rotation."""
    server, _ = synthetic_metrics_server
    stopping = asyncio.Event()
    answered: set[int] = set()  # streams that got their first bytes
    completed = 0

    async def stream_until_stopped(client: httpx.AsyncClient, index: int) -> None:
        nonlocal completed
        # Lengths differ, so that the streams do not all end (and start again) together.
        body = {"prompt": PROMPT, "max_tokens": 64 + 4 * index, "ignore_eos": True}
        while not stopping.is_set():
            async with client.stream("POST", f"{server.url}/generate", json=body) as response:
                assert response.status_code == 200, await response.aread()
                async for _ in response.aiter_raw():
                    answered.add(index)
            completed += 1

    polls: list[tuple[int, str]] = []  # (status, body)
    limits = httpx.Limits(max_connections=LOAD_STREAMS)
    async with (
        httpx.AsyncClient(timeout=120, limits=limits) as client,
        httpx.AsyncClient(timeout=30) as prober,  # a connection of its own, as a kubelet's
    ):
        streams = [
            asyncio.ensure_future(stream_until_stopped(client, i)) for i in range(LOAD_STREAMS)
        ]
        try:
            all_answered = await wait_for_async(lambda: len(answered) == LOAD_STREAMS, 120, 0.01)
            assert all_answered, f"only {len(answered)} of {LOAD_STREAMS} streams got an answer"
            finished_before = completed
            loop = asyncio.get_running_loop()
            until = loop.time() + LOAD_SECONDS
            while loop.time() < until or len(polls) < 10:
                response = await prober.get(f"{server.url}/readyz")
                polls.append((response.status_code, response.text))
                await asyncio.sleep(0.1)  # the probe's period, not a wait for some state
        finally:
            stopping.set()
            await asyncio.wait_for(asyncio.gather(*streams), 120)
    assert [p for p in polls if p[0] != 200] == [], f"not 200 under load: {polls}"
    assert len(polls) >= 10, polls
    assert completed > finished_before, "no stream completed while polling: no real load"


def test_readyz_follows_a_restarted_tritonserver(synthetic_metrics_server) -> None:
    """The supervisor restarts a crashed tritonserver on the same ports; the service's gRPC
    client reconnects and requests succeed again without restarting BentoML. /readyz is never
    200 while a request fails, and is 200 at the latest 1 s after the first request is served
    again."""
    server, metrics_port = synthetic_metrics_server
    (triton,) = [p for p in server.tritons() if p.name() == "tritonserver"]
    triton.kill()
    triton.wait(10)

    rounds: list[tuple[float, int, bool]] = []  # (when, /readyz's status, served)
    served_at = ready_at = None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        # When the poll was sent, not answered: how long /readyz itself takes on a loaded host
        # is not what this measures.
        asked_at = time.monotonic()
        status = readyz_status(server.url)
        now = time.monotonic()
        if status == 200 and ready_at is None:
            ready_at = asked_at
        if served_at is not None:
            if status == 200 or now - served_at > 5:
                break
        else:
            served = serves_requests(server.url)
            rounds.append((now, status, served))
            assert served or status != 200, f"/readyz was 200, and a request then failed: {rounds}"
            if served:
                served_at = time.monotonic()
        time.sleep(0.1)  # the polling period
    assert served_at is not None, server.log()[-3000:]
    assert ready_at is not None and ready_at - served_at <= 1.0, (ready_at, served_at, rounds)
    assert any(status != 200 for _, status, _ in rounds), "the outage was never reported"
    assert server.process.poll() is None
    (restarted,) = [p for p in server.tritons() if p.name() == "tritonserver"]
    assert restarted.pid != triton.pid
    assert engine_counters(metrics_port)  # same metrics port after the restart


def test_shutdown_leaves_no_triton_process(synthetic_metrics_server) -> None:
    """Runs last in this module: it stops the dedicated server."""
    server, _ = synthetic_metrics_server
    tritons = server.tritons()
    names = {" ".join(p.cmdline()[:1]).rsplit("/", 1)[-1] for p in tritons}
    assert names >= {"tritonserver", "triton_python_backend_stub"}, names
    server.stop()
    assert server.process.returncode is not None
    gone, alive = psutil.wait_procs(tritons, timeout=15)
    assert alive == [], f"left running after SIGTERM: {alive}"


# --- HTTP keep-alive ------------------------------------------------------------------------------


def _http_exchange(sock: socket.socket, request: bytes) -> bytes:
    """One request on an open connection; the response head and body (Content-Length framed)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data  # the server closed the connection
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_idle_keep_alive_connection_outlives_common_client_expiry(
    demo_server: BentoServer,
) -> None:
    """uvicorn's default 5 s keep-alive equals httpx's pool expiry: the server closing a
    connection as a client reuses it resets that request. The service keeps idle connections
    for 75 s, so one idle for 6 s still carries the next request."""
    host, port = demo_server.url.removeprefix("http://").split(":")
    request = f"GET /readyz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        assert _http_exchange(sock, request).startswith(b"HTTP/1.1 200")
        time.sleep(6)  # the idle time under test, longer than a 5 s keep-alive
        assert _http_exchange(sock, request).startswith(b"HTTP/1.1 200")


def test_direct_route_starts_only_the_engine_model(demo_server: BentoServer) -> None:
    """The direct route never calls the ensemble's Python models, so Triton does not load them:
    two python stubs (the CPU engine in the tensorrt_llm slot, the prompt scorer beside it),
    not six."""
    stubs = [
        " ".join(p.cmdline()) for p in demo_server.tritons() if "backend_stub" in p.cmdline()[0]
    ]
    assert len(stubs) == 2, stubs
    assert sorted(stub.split()[-2] for stub in stubs) == ["prompt_logprobs_0_0", "tensorrt_llm_0_0"]
