"""Readiness: /readyz's answer from the evidence gathered off the request path (checks of Triton's
readiness endpoint, inference responses), weighed against the running process; and check_ready
against a real HTTP server on loopback that answers ready, not ready, or too late, and lists the
models a slow start still waits for."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tensorrtllm_backend.triton.command import (
    TritonPorts,
    check_ready,
    find_free_port,
    models_not_ready,
)
from tensorrtllm_backend.triton.readiness import Readiness

PORTS = TritonPorts(grpc=1, http=2, metrics=3)


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Triton:
    """A supervisor as readiness sees it: its ports, and when its process started."""

    running_since: float | None = 90.0
    ports: TritonPorts = PORTS


@dataclass
class Channel:
    last_response_at: float = 0.0
    reconnecting: bool = False


@dataclass
class Probe:
    """Triton's answers to the checks, in order (True ready, False not, None: too late)."""

    answers: list[bool | None]

    def __call__(self, ports: TritonPorts, timeout: float) -> bool | None:
        assert ports == PORTS
        return self.answers.pop(0)


def readiness(*answers: bool | None, **fields: object) -> tuple[Readiness, Triton, Channel, Clock]:
    triton, channel, clock = Triton(), Channel(), Clock()
    ready = Readiness(triton, channel, probe=Probe(list(answers)), clock=clock, **fields)  # type: ignore[arg-type]
    return ready, triton, channel, clock


def test_ready_once_a_check_passes_since_the_process_started() -> None:
    ready, _, _, clock = readiness(True)
    assert ready.not_ready_reason() == (
        "tritonserver has not passed a readiness check since it started"
    )
    clock.now += 0.5
    assert ready.check() is True
    assert ready.not_ready_reason() is None


def test_a_check_too_slow_to_answer_keeps_the_replica_ready_until_the_evidence_is_stale() -> None:
    ready, _, _, clock = readiness(True, None, None, stale_after_s=10.0)
    ready.check()
    clock.now += 6
    assert ready.check() is None
    assert ready.not_ready_reason() is None  # a busy host answering late is not a failure
    clock.now += 4
    assert ready.check() is None
    assert ready.not_ready_reason() == (
        "tritonserver passed no readiness check and answered no request for 10 s"
    )


def test_inference_responses_count_as_checks_passed() -> None:
    ready, _, channel, clock = readiness(True, None, None, stale_after_s=10.0)
    ready.check()
    for _ in range(2):  # every check times out, requests keep being answered
        clock.now += 8
        channel.last_response_at = clock.now - 0.1
        assert ready.check() is None
        assert ready.not_ready_reason() is None


def test_a_failed_check_counts_until_newer_evidence() -> None:
    ready, _, channel, clock = readiness(True, False, True)
    ready.check()
    clock.now += 1
    assert ready.check() is False
    assert ready.not_ready_reason() == "tritonserver does not pass its readiness check"
    clock.now += 0.5
    channel.last_response_at = clock.now  # answered a request since: it serves
    assert ready.not_ready_reason() is None


def test_no_process_is_not_ready_whatever_was_seen_before() -> None:
    ready, triton, channel, clock = readiness(True)
    ready.check()
    channel.last_response_at = clock.now
    triton.running_since = None  # it died; the supervisor has not started another yet
    assert ready.not_ready_reason() == "no tritonserver is running"
    assert ready.check() is None  # nothing to check


def test_evidence_from_before_a_restart_does_not_count() -> None:
    ready, triton, channel, clock = readiness(True, None)
    ready.check()
    channel.last_response_at = clock.now
    clock.now += 3
    triton.running_since = clock.now  # a new tritonserver, still loading its models
    assert ready.not_ready_reason() == (
        "tritonserver has not passed a readiness check since it started"
    )
    clock.now += 5
    assert ready.check() is None
    assert ready.not_ready_reason() is not None
    # Its first answered request shows it serves, before any check passes.
    channel.last_response_at = clock.now
    assert ready.not_ready_reason() is None


def test_a_channel_waiting_to_reconnect_cannot_serve() -> None:
    ready, _, channel, _ = readiness(True)
    ready.check()
    channel.reconnecting = True
    assert ready.not_ready_reason() == "the gRPC channel to tritonserver is reconnecting"
    channel.reconnecting = False
    assert ready.not_ready_reason() is None


def test_the_answer_does_not_wait_for_a_check_in_progress() -> None:
    """The background thread checks; /readyz never waits for it, even while a check hangs."""
    checks, hanging, release = [], threading.Event(), threading.Event()

    def probe(ports: TritonPorts, timeout: float) -> bool | None:
        checks.append(ports)
        if len(checks) == 1:
            return True
        hanging.set()
        release.wait(30)  # as on a wedged server, until the check's own timeout
        return None

    ready = Readiness(Triton(running_since=0.0), Channel(), probe=probe, interval_s=0.01)
    ready.start()
    try:
        assert hanging.wait(30), "the thread did not check again"
        assert ready.not_ready_reason() is None
    finally:
        release.set()
        ready.stop()


# --- check_ready against a real HTTP server --------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200
    index: list[dict[str, str]] = []
    delay = threading.Event()  # set: answer; clear: hold the answer back

    def do_GET(self) -> None:
        assert self.path == "/v2/health/ready"
        self.delay.wait(10)
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        assert self.path == "/v2/repository/index"
        body = json.dumps(self.index).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[tuple[TritonPorts, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {"delay": threading.Event()})
    handler.delay.set()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield TritonPorts(grpc=1, http=server.server_address[1], metrics=3), handler
    finally:
        handler.delay.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_check_ready_tells_ready_not_ready_and_no_answer_apart(health_server) -> None:
    ports, handler = health_server
    assert check_ready(ports, timeout=10) is True
    handler.status = 503
    assert check_ready(ports, timeout=10) is False
    handler.delay.clear()  # the answer comes after the timeout
    assert check_ready(ports, timeout=0.2) is None


def test_check_ready_with_nothing_listening_is_not_ready() -> None:
    ports = TritonPorts(grpc=1, http=find_free_port(), metrics=3)
    assert check_ready(ports, timeout=5) is False


def test_the_models_a_start_waits_for_are_named_from_the_repository_index(health_server) -> None:
    ports, handler = health_server
    handler.index = [
        {"name": "preprocessing", "version": "1", "state": "READY"},
        {"name": "tensorrt_llm", "version": "1", "state": "LOADING"},
        {"name": "postprocessing", "state": "UNAVAILABLE", "reason": "unloaded"},
    ]
    assert models_not_ready(ports, timeout=10) == [
        "tensorrt_llm (LOADING)",
        "postprocessing (UNAVAILABLE: unloaded)",
    ]
    handler.index = [{"name": "preprocessing", "version": "1", "state": "READY"}]
    assert models_not_ready(ports, timeout=10) == []
    closed = TritonPorts(grpc=1, http=find_free_port(), metrics=3)
    assert models_not_ready(closed, timeout=5) is None
