"""Faults with a real `bentoml serve`, its supervised tritonserver and the CPU engine:
Triton killed mid-stream, client disconnects, SIGTERM / SIGKILL of the service, and startups that
must fail with a clear error. Every process started here is stopped here (see conftest)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bentoml
import httpx
import psutil
import pytest

from tests.integration.conftest import (
    counter_change,
    engine_counters,
    health_status,
    readyz_status,
    serves_requests,
)
from tests.waiting import wait_for

if TYPE_CHECKING:
    from conftest import BentoServer  # tests/integration/conftest.py

pytestmark = pytest.mark.integration

PROMPT = "Once upon a time"
LONG = {"prompt": PROMPT, "max_tokens": 600, "ignore_eos": True}  # 30 s at 50 ms per token


# --- helpers -------------------------------------------------------------------------------------


def tritonserver_of(server: BentoServer) -> psutil.Process:
    (main,) = [p for p in server.tritons() if "tritonserver" in p.cmdline()[0]]
    return main


def wait_ready(server: BentoServer, timeout: float = 120.0) -> None:
    def ready() -> bool:
        assert server.process.poll() is None, server.log()[-3000:]
        try:
            return httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_for(ready, timeout, 0.5), server.log()[-3000:]


def wait_for_log(server: BentoServer, needle: str, timeout: float = 90.0) -> str:
    assert wait_for(lambda: needle in server.log(), timeout, 0.5), (
        f"{needle!r} not in the log after {timeout}s:\n{server.log()[-4000:]}"
    )
    return server.log()


@dataclass
class StreamWatch:
    """Reads one streaming response on a thread, recording what arrived and how it ended."""

    server: BentoServer
    path: str
    body: dict[str, Any]
    chunks: list[str] = field(default_factory=list)
    error: BaseException | None = None
    ended_at: float | None = None
    status: int | None = None
    started: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with httpx.stream(
                "POST", self.server.url + self.path, json=self.body, timeout=httpx.Timeout(60.0)
            ) as response:
                self.status = response.status_code
                for text in response.iter_text():
                    self.chunks.append(text)
                    self.started.set()
        except BaseException as error:  # recorded for the test to judge
            self.error = error
        finally:
            self.ended_at = time.monotonic()
            self.started.set()

    @property
    def text(self) -> str:
        return "".join(self.chunks)


# --- Triton killed mid-stream --------------------------------------------------------------------


def test_client_disconnect_stops_the_engine(slow_metrics_server) -> None:
    server, metrics_port = slow_metrics_server
    for path, body in (
        ("/generate", LONG),
        ("/v1/completions", {"model": "trtllm-slow", "stream": True, **LONG}),
    ):
        before = engine_counters(metrics_port)
        with httpx.stream("POST", server.url + path, json=body, timeout=30) as response:
            assert response.status_code == 200
            received = 0
            for _ in response.iter_raw():
                received += 1
                if received >= 3:
                    break

        # closing the response drops the connection: the engine must stop generating for it
        def cancelled(before: dict[str, float] = before) -> bool:
            now = engine_counters(metrics_port)
            return (
                now["trtllm_cpu_engine_cancelled_requests_total"]
                > before["trtllm_cpu_engine_cancelled_requests_total"]
                and now["trtllm_cpu_engine_active_requests"] == 0
            )

        assert wait_for(cancelled, 15.0), (path, engine_counters(metrics_port))
        settled = engine_counters(metrics_port)["trtllm_cpu_engine_generated_tokens_total"]
        time.sleep(0.5)  # 10 steps at 50 ms: nothing more may be generated for it
        after = engine_counters(metrics_port)
        assert after["trtllm_cpu_engine_generated_tokens_total"] == settled
        generated = settled - before["trtllm_cpu_engine_generated_tokens_total"]
        # Stopped, not run out: how many tokens a loaded host makes before the cancel lands
        # (a few at 50 ms each) is not the point; half of the 600 would take 15 s.
        assert generated < LONG["max_tokens"] // 2, (
            f"{path}: {generated} tokens generated for a dropped stream"
        )


def test_stop_string_lets_the_engine_end_the_request(slow_metrics_server) -> None:
    """The engine gets the stop words too and ends the request itself at the stop string; the
    service must not cancel it as well: a cancellation racing with the request's own end crashes
    tritonserver 2.51 (server#7840)."""
    server, metrics_port = slow_metrics_server
    body = {"prompt": PROMPT, "max_tokens": 16, "ignore_eos": True}
    full = httpx.post(f"{server.url}/generate_text", json=body, timeout=60).json()["text"]
    stop = full.split()[len(full.split()) // 2]
    before = engine_counters(metrics_port)
    cut = httpx.post(f"{server.url}/generate_text", json={**body, "stop": [stop]}, timeout=60)
    assert cut.status_code == 200, cut.text
    assert cut.json()["finish_reason"] == "stop" and full.startswith(cut.json()["text"])

    def settled() -> bool:
        return engine_counters(metrics_port)["trtllm_cpu_engine_active_requests"] == 0

    assert wait_for(settled, 15.0)
    change = counter_change(before, engine_counters(metrics_port))
    assert change["trtllm_cpu_engine_cancelled_requests_total"] == 0
    generated = change["trtllm_cpu_engine_generated_tokens_total"]
    assert generated < body["max_tokens"], "the engine ran on past the stop string"


def test_tritonserver_killed_mid_stream(slow_metrics_server) -> None:
    server, _ = slow_metrics_server
    native = StreamWatch(server, "/generate", LONG)
    chat = StreamWatch(
        server, "/v1/chat/completions",
        {"model": "trtllm-slow", "stream": True, "max_tokens": 600, "ignore_eos": True,
         "messages": [{"role": "user", "content": "hi"}]},
    )  # fmt: skip
    assert native.started.wait(20) and chat.started.wait(20)
    assert wait_for(lambda: len(native.chunks) >= 3 and len(chat.chunks) >= 3, 30), "no stream"
    assert native.error is None and chat.error is None

    tritonserver_of(server).kill()
    killed_at = time.monotonic()
    # while Triton is down: not ready, and a non-streaming request is a 503 with Retry-After
    assert wait_for(lambda: readyz_status(server.url) == 503, 10.0), (
        "readyz did not report the outage"
    )
    # vLLM's /health too: routers in front of replicas take this one out of rotation by it
    assert wait_for(lambda: health_status(server.url) == 503, 10.0), "/health stayed 200"
    outage = httpx.post(
        f"{server.url}/generate_text", json={"prompt": PROMPT, "max_tokens": 4}, timeout=10
    )
    assert outage.status_code == 503, outage.text
    assert "retry" in outage.text.lower() and "retry-after" in outage.headers
    # the streaming API too (BentoML alone would say "unexpected error", without Retry-After)
    outage = httpx.post(
        f"{server.url}/generate", json={"prompt": PROMPT, "max_tokens": 4}, timeout=10
    )
    assert outage.status_code == 503, outage.text
    assert "retry shortly" in outage.json()["error"] and "retry-after" in outage.headers

    # every in-flight stream ends within 5 s, visibly failed
    for watch in (native, chat):
        watch.thread.join(max(0.1, killed_at + 5.0 - time.monotonic()))
        assert not watch.thread.is_alive(), f"{watch.path}: still streaming 5 s after the kill"
        assert watch.ended_at is not None and watch.ended_at - killed_at < 5.0
    assert "data: [DONE]" not in chat.text
    assert '"error"' in chat.text or chat.error is not None, chat.text[-500:]

    # the supervisor restarts Triton and new requests succeed (as soon as they do; the bound
    # is the start-up allowance wait_ready gives)
    assert wait_for(lambda: serves_requests(server.url), 120.0, 0.5), server.log()[-3000:]
    assert readyz_status(server.url) == 200 and health_status(server.url) == 200
    # checked last so that the recovery above is checked too: a cut stream must not look complete
    assert native.error is not None, (
        "the native stream ended like a normal completion: the client cannot tell it failed "
        f"(got {len(native.text)} chars, no transport error)"
    )


def test_wedged_tritonserver_is_restarted(bento_launcher, slow_synthetic_model: str) -> None:
    """A tritonserver that is alive but answers nothing (here: SIGSTOP; seen for real when a
    Python stub crashed) would leave every stream waiting: the watchdog restarts it."""
    server = bento_launcher(slow_synthetic_model, {"TRTLLM_STALL_TIMEOUT_S": "3"}, wait=True)
    wedged = tritonserver_of(server)
    watch = StreamWatch(server, "/generate", LONG)
    assert watch.started.wait(20)
    os.kill(wedged.pid, signal.SIGSTOP)
    try:
        # 3 s of stall, then the restart ends the stream; the wait only has to end some time
        # before the client's own 60 s read timeout would.
        watch.thread.join(45)
        assert not watch.thread.is_alive(), "the stream still waits on the wedged tritonserver"
        assert watch.error is not None, "a cut stream must not look complete"
        log = wait_for_log(server, "restarting tritonserver: no response for", 10)
        assert "TRTLLM_STALL_TIMEOUT_S" in log
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            wedged.resume()
    wait_ready(server)
    assert tritonserver_of(server).pid != wedged.pid
    again = httpx.post(f"{server.url}/generate_text", json={"prompt": PROMPT, "max_tokens": 4},
                       timeout=60)  # fmt: skip
    assert again.status_code == 200, again.text


def python_stub(server: BentoServer, model: str) -> psutil.Process:
    (stub,) = [p for p in server.tritons() if f"{model}/1/model.py" in " ".join(p.cmdline())]
    return stub


def test_unhealthy_python_stub_restarts_tritonserver(bento_launcher, demo_model: str) -> None:
    """A Python stub that stops answering (here: SIGSTOP) makes tritonserver 2.51 fail every
    later request to its model, for good. The errors keep arriving, so the stall watchdog never
    fires: without a restart the service would answer 502 for ever."""
    server = bento_launcher(demo_model, {"TRTLLM_ROUTE": "ensemble"}, wait=True)
    body = {"prompt": PROMPT, "max_tokens": 4}
    assert httpx.post(f"{server.url}/generate_text", json=body, timeout=60).status_code == 200
    triton = tritonserver_of(server)
    python_stub(server, "postprocessing").suspend()

    failed = httpx.post(f"{server.url}/generate_text", json=body, timeout=60)
    assert failed.status_code == 503, failed.text
    assert "postprocessing_0_0" in failed.text and "retry-after" in failed.headers
    wait_for_log(server, "restarting tritonserver: its model instance postprocessing_0_0", 10)
    assert wait_for(lambda: serves_requests(server.url), 60.0, 0.5), server.log()[-3000:]
    assert tritonserver_of(server).pid != triton.pid


def test_dead_python_stub_ends_its_streams_and_restarts_tritonserver(
    bento_launcher, slow_synthetic_model: str
) -> None:
    """A stub that died (here: SIGKILL of the CPU engine's; for real, tritonserver 2.51's BLS
    stub aborting on a corrupted heap) leaves its requests waiting for ever, and tritonserver
    stays up. The supervisor sees the dead stub and restarts tritonserver."""
    server = bento_launcher(slow_synthetic_model, wait=True)
    triton = tritonserver_of(server)
    watch = StreamWatch(server, "/generate", LONG)
    assert watch.started.wait(20)
    python_stub(server, "tensorrt_llm").kill()
    killed_at = time.monotonic()

    # The supervisor looks for dead stubs every second; the bound only has to stay below the
    # client's own 60 s read timeout, which would end the stream too.
    watch.thread.join(30)
    assert not watch.thread.is_alive(), "the stream still waits on the dead stub"
    assert watch.error is not None, "a cut stream must not look complete"
    assert watch.ended_at is not None and watch.ended_at - killed_at < 30.0
    wait_for_log(
        server, "restarting tritonserver: the Python backend stub of tensorrt_llm (pid", 10
    )
    wait_ready(server)
    assert tritonserver_of(server).pid != triton.pid
    assert serves_requests(server.url)


def test_sigterm_drains_the_stream_and_leaves_nothing(slow_metrics_server) -> None:
    """Runs last on the shared server: it stops it."""
    server, _ = slow_metrics_server
    tritons = server.tritons()
    assert tritons
    watch = StreamWatch(server, "/generate", {"prompt": PROMPT, "max_tokens": 40,
                                              "ignore_eos": True})  # fmt: skip
    assert watch.started.wait(20)
    os.kill(server.process.pid, signal.SIGTERM)
    sent_at = time.monotonic()
    watch.thread.join(30)
    assert not watch.thread.is_alive(), "the stream hung after SIGTERM"
    try:
        server.process.wait(40)
    except Exception:
        pytest.fail(f"bentoml serve still running 40 s after SIGTERM:\n{server.log()[-3000:]}")
    exited_after = time.monotonic() - sent_at
    _gone, alive = psutil.wait_procs(tritons, timeout=5)
    assert not alive, f"left running after SIGTERM: {[p.pid for p in alive]}"
    # drained (all 40 tokens) or ended; never a hang
    assert watch.text, "nothing was streamed"
    assert exited_after < 40


# --- SIGKILL of the worker -----------------------------------------------------------------------


def test_sigkill_of_the_worker_takes_triton_down(bento_launcher, synthetic_model: str) -> None:
    server = bento_launcher(synthetic_model)
    wait_ready(server)
    tritons = server.tritons()
    main = [p for p in tritons if "tritonserver" in p.cmdline()[0]][0]
    worker = main.parent()
    assert worker is not None and worker.pid != server.process.pid
    assert "_bentoml_impl.worker" in " ".join(worker.cmdline())
    worker.kill()
    # tritonserver gets SIGKILL at once; its orphaned stubs notice on their own (~10 s).
    _gone, alive = psutil.wait_procs(tritons, timeout=60)
    assert not alive, (
        f"still running 60 s after the worker died: "
        f"{[(p.pid, p.name()) for p in alive if p.is_running()]}"
    )


# --- startups that must fail clearly --------------------------------------------------------------


def _fails_clearly(server: BentoServer, needles: tuple[str, ...], timeout: float = 90.0) -> str:
    """Wait for the log to name the cause; the service must never report ready meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = server.log()
        if all(n in log for n in needles):
            assert readyz_status(server.url) != 200
            return log
        if server.process.poll() is not None:
            break
        time.sleep(0.5)
    log = server.log()
    missing = [n for n in needles if n not in log]
    assert not missing, f"{missing} not in the log:\n{log[-4000:]}"
    return log


def test_missing_model_names_the_model(bento_launcher) -> None:
    server = bento_launcher("nope-no-such-model:latest")
    _fails_clearly(server, ("nope-no-such-model",))
    assert wait_for(lambda: server.process.poll() is not None, 30), "serve kept running"
    assert server.process.returncode != 0


def test_triton_port_taken_is_a_clear_startup_error(bento_launcher, synthetic_model: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = bento_launcher(synthetic_model, {"TRTLLM_TRITON_HTTP_PORT": str(port)})
        log = _fails_clearly(server, ("TritonStartupError", str(port)))
    assert "in use" in log.lower() or "address already" in log.lower() or "bind" in log.lower()


def _broken_copy(synthetic_model: str, name: str, tmp_path: Path, breaker: Any) -> str:
    """Pack a fresh synthetic model under `name` and break its stored engine config."""
    import pack_model

    args = ["--synthetic", "--name", name, "--max-input-len", "64", "--max-seq-len", "128"]
    tag = pack_model.run(pack_model.build_parser().parse_args([*args, "--no-progress"]))
    assert tag is not None
    config = Path(bentoml.models.get(tag).path) / "engines" / "config.json"
    config.write_text(breaker(config.read_text()))
    return tag


def test_triton_failing_to_load_the_model_shows_its_log(
    bento_launcher, synthetic_model: str, tmp_path: Path
) -> None:
    def bad_mode(text: str) -> str:
        data = json.loads(text)
        data["cpu_engine"]["mode"] = "warp-drive"
        return json.dumps(data)

    tag = _broken_copy(synthetic_model, "trtllm-broken-mode", tmp_path, bad_mode)
    server = bento_launcher(tag)
    # The service's own check passes; tritonserver's CPU engine refuses: the error must carry
    # the cause from Triton's log, and it ends the start (no worker started again).
    _fails_clearly(server, ("TritonModelLoadError", "warp-drive", "model 'tensorrt_llm'"))
    assert wait_for(lambda: server.process.poll() is not None, 30), "serve kept running"
    # Each failed start is printed once (BentoML's logging printed server errors twice).
    log = wait_for_log(server, "Application startup failed")
    assert log.count("Traceback (most recent call last)") <= log.count("Running startup hook")
    assert log.count("Application startup failed") <= log.count("Running startup hook")


def test_unreadable_engine_config_is_named(
    bento_launcher, synthetic_model: str, tmp_path: Path
) -> None:
    tag = _broken_copy(synthetic_model, "trtllm-broken-json", tmp_path, lambda t: t[: len(t) // 2])
    server = bento_launcher(tag)
    _fails_clearly(server, ("config.json",))
