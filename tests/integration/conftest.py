"""Fixtures that start real processes: packed models in a private model store and a real
`bentoml serve` on a free loopback port. Every process started here is stopped here."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tensorrtllm_backend.triton.command import find_free_port, with_death_signal

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pack_model  # noqa: E402


def pack(*args: str) -> str:
    """Run pack_model in-process; returns the stored tag."""
    parsed = pack_model.build_parser().parse_args([*args, "--no-progress"])
    tag = pack_model.run(parsed)
    assert tag is not None
    return tag


@pytest.fixture(scope="session")
def demo_model() -> str:
    return pack("--demo", "--max-input-len", "256", "--max-seq-len", "512")


@pytest.fixture(scope="session")
def llmapi_demo_model() -> str:
    """The demo checkpoint packed for the LLM API workflow, with demo_model's limits (the same
    weights: greedy text is the same on both routes)."""
    return pack("--demo", "--workflow", "llmapi", "--max-input-len", "256", "--max-seq-len", "512")


@pytest.fixture(scope="session")
def synthetic_model() -> str:
    return pack("--synthetic", "--itl-ms", "2", "--max-input-len", "256", "--max-seq-len", "1024")


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo Llama checkpoint (built locally), read-only: tests that need a model root next
    to it link it in."""
    from tensorrtllm_backend.packing.demo import build_demo_checkpoint

    return build_demo_checkpoint(tmp_path_factory.mktemp("demo") / "checkpoint")


@pytest.fixture(scope="session")
def demo_tokenizer(demo_checkpoint: Path):
    """The demo checkpoint's tokenizer, loaded as the pre/post-processing models load it."""
    from tensorrtllm_backend.common.tokenization import load_tokenizer

    return load_tokenizer(demo_checkpoint)


def openai_client(
    server: BentoServer, timeout: float, *, asynchronous: bool = False
) -> openai.OpenAI | openai.AsyncOpenAI:
    """The official `openai` client on a server's /v1. No retries: a retried 5xx would hide
    exactly the failures the tests look for."""
    client = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return client(base_url=f"{server.url}/v1", api_key="unused", timeout=timeout, max_retries=0)


# What the shared openai fixtures wait for one answer: the longest generation a test asks for,
# on a loaded 2-core host.
CLIENT_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def client(server: BentoServer) -> openai.OpenAI:
    """The `openai` client on the module's `server` (a module that uses it defines `server`)."""
    return openai_client(server, CLIENT_TIMEOUT_S)


@pytest.fixture
def async_client(server: BentoServer) -> openai.AsyncOpenAI:
    return openai_client(server, CLIENT_TIMEOUT_S, asynchronous=True)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    """The served model's name, as /v1/models lists it."""
    return client.models.list().data[0].id


def engine_counters(metrics_port: int) -> dict[str, float]:
    """The CPU engine's metrics on Triton's metrics port, each summed over its label sets."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    counters: dict[str, float] = {}
    for name, value in re.findall(r"^(trtllm_cpu_engine_\w+)(?:\{[^}]*\})? (\S+)$", text, re.M):
        counters[name] = counters.get(name, 0.0) + float(value)
    return counters


def wait_counters(
    metrics_port: int, done: Callable[[dict[str, float]], bool], timeout: float = 10.0
) -> dict[str, float]:
    """The engine's counters once `done` holds for them, or as they are after `timeout`."""
    deadline = time.monotonic() + timeout
    counters = engine_counters(metrics_port)
    while not done(counters) and time.monotonic() < deadline:
        time.sleep(0.1)
        counters = engine_counters(metrics_port)
    return counters


def counter_change(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """How much each engine metric moved between two readings."""
    return {name: value - before.get(name, 0.0) for name, value in after.items()}


def private_bentoml_home(tmp_path: Path) -> str:
    """A BENTOML_HOME of its own for one `bentoml serve`, sharing the test model store.

    Every `bentoml serve` empties $BENTOML_HOME/prometheus_multiproc_dir when it starts, so
    servers sharing a home wipe each other's metrics.
    """
    home = Path(tempfile.mkdtemp(prefix="bentoml-home-", dir=tmp_path))
    (home / "models").symlink_to(Path(os.environ["BENTOML_HOME"]) / "models")
    return str(home)


def tritons_under(pid: int) -> list[psutil.Process]:
    """tritonserver and python stubs started (transitively) by pid."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in children if _is_triton(p)]


def _is_triton(process: psutil.Process) -> bool:
    try:
        name = " ".join(process.cmdline()[:1])
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
    return "tritonserver" in name or "triton_python_backend_stub" in name


@dataclass
class BentoServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tritons(self) -> list[psutil.Process]:
        return tritons_under(self.process.pid)

    def stop(self, timeout: float = 30.0) -> list[psutil.Process]:
        """SIGTERM the server; return the triton processes it had, for leak checks."""
        started = self.tritons()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        return started


def launch_bento_server(
    model_tag: str, tmp_path: Path, env: dict[str, str] | None = None, host: str = "127.0.0.1"
) -> BentoServer:
    """Start `bentoml serve` without waiting for readiness (for startups that must fail).
    `host` is what BentoML binds; the returned url always uses loopback."""
    port = find_free_port()
    log_path = tmp_path / f"bentoml-{port}.log"
    environment = {
        **os.environ, "TRTLLM_MODEL": model_tag, "BENTOML_HOME": private_bentoml_home(tmp_path),
        **(env or {}),
    }  # fmt: skip
    with log_path.open("wb") as log:
        # A killed pytest (no fixture teardown) still stops its servers: SIGTERM when the
        # spawning thread dies, so `bentoml serve` shuts its workers and Triton down in order.
        process = subprocess.Popen(
            with_death_signal([sys.executable, "-m", "bentoml", "serve", "service:TRTLLM",
                               "--host", host, "--port", str(port)], signal.SIGTERM),
            cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return BentoServer(f"http://127.0.0.1:{port}", process, log_path)


def serves_requests(url: str, max_tokens: int = 4) -> bool:
    """Whether a short /generate_text succeeds right now (for waits on recovery)."""
    try:
        response = httpx.post(
            f"{url}/generate_text",
            json={"prompt": "Once upon a time", "max_tokens": max_tokens},
            timeout=10,
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def readyz_status(url: str, timeout: float = 10.0) -> int:
    """/readyz's status code right now; 0 when the server did not answer."""
    try:
        return httpx.get(f"{url}/readyz", timeout=timeout).status_code
    except httpx.HTTPError:
        return 0


def health_status(url: str, timeout: float = 10.0) -> int:
    """vLLM's /health status code right now (what routers poll); 0 when the server did not
    answer."""
    try:
        return httpx.get(f"{url}/health", timeout=timeout).status_code
    except httpx.HTTPError:
        return 0


def wait_until_ready(server: BentoServer, timeout: float = 180.0) -> BentoServer:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"bentoml serve exited early:\n{server.log()[-4000:]}")
        try:
            if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"bentoml serve not ready after {timeout}s:\n{server.log()[-4000:]}")


# What `bentoml serve` logs when its port was taken between our pick and its bind (another
# xdist worker's server or Triton got it first): the only startup failure worth a retry.
PORT_RACE = "Could not bind"


def start_bento_server(
    model_tag: str, tmp_path: Path, env: dict[str, str] | None = None, timeout: float = 180.0,
    host: str = "127.0.0.1",
) -> BentoServer:  # fmt: skip
    for attempt in range(3):
        server = launch_bento_server(model_tag, tmp_path, env, host)
        try:
            return wait_until_ready(server, timeout)
        except AssertionError:
            server.stop()
            if attempt == 2 or PORT_RACE not in server.log():
                raise
    raise AssertionError("unreachable")


@pytest.fixture
def bento_server_factory(tmp_path: Path) -> Iterator[Callable[..., BentoServer]]:
    servers: list[BentoServer] = []

    def factory(model_tag: str, env: dict[str, str] | None = None) -> BentoServer:
        server = start_bento_server(model_tag, tmp_path, env)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def demo_server(demo_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BentoServer]:
    server = start_bento_server(demo_model, tmp_path_factory.mktemp("demo-server"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def llmapi_demo_server(
    llmapi_demo_model: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BentoServer]:
    """`bentoml serve` of llmapi_demo_model: the llmapi route to our LLM-API model."""
    server = start_bento_server(llmapi_demo_model, tmp_path_factory.mktemp("llmapi-demo-server"))
    yield server
    server.stop()


ROUTE_SERVERS = {"direct": "demo_server", "llmapi": "llmapi_demo_server"}


@pytest.fixture(scope="module", params=list(ROUTE_SERVERS))
def route_server(request: pytest.FixtureRequest) -> BentoServer:
    """The demo model served on each token-id route in turn: `direct` (the CPU engine in
    tensorrt_llm) and `llmapi` (our LLM-API model on its CPU stand-in)."""
    return request.getfixturevalue(ROUTE_SERVERS[request.param])  # type: ignore[no-any-return]


def _metrics_server_fixture(name: str, model_fixture: str, doc: str) -> Callable[..., object]:
    """A module fixture serving the model `model_fixture` packs, its tritonserver exposing its
    metrics on a known port (for engine counters): yields (server, metrics port). Tests may
    stop the server themselves (stopping again is harmless)."""

    def metrics_server(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[tuple[BentoServer, int]]:
        metrics_port = find_free_port()
        server = start_bento_server(
            request.getfixturevalue(model_fixture),
            tmp_path_factory.mktemp(name),
            env={"TRTLLM_TRITON_METRICS_PORT": str(metrics_port)},
        )
        yield server, metrics_port
        stop_and_reap(server)

    metrics_server.__doc__ = doc
    return pytest.fixture(scope="module", name=name)(metrics_server)


synthetic_metrics_server = _metrics_server_fixture(
    "synthetic_metrics_server", "synthetic_model", "The synthetic model, metrics on a known port."
)
slow_metrics_server = _metrics_server_fixture(
    "slow_metrics_server", "slow_synthetic_model", "The 50 ms/token model, metrics on a known port."
)


@pytest.fixture(scope="session")
def slow_synthetic_model() -> str:
    """Synthetic engine at 50 ms per token: streams stay in flight long enough to act on them."""
    return pack(
        "--synthetic", "--itl-ms", "50", "--name", "trtllm-slow",
        "--max-input-len", "256", "--max-seq-len", "1024",
    )  # fmt: skip


def stop_and_reap(server: BentoServer) -> None:
    """Stop a server, then SIGKILL (by pid) any process it had started that is still alive: the
    bentoml worker runs in its own process group, so killpg of the arbiter may miss it."""
    try:
        started = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        started = []
    server.stop()
    _gone, alive = psutil.wait_procs(started, timeout=15)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=5)


def _launcher(tmp_path: Path) -> tuple[list[BentoServer], Callable[..., BentoServer]]:
    servers: list[BentoServer] = []

    def launcher(
        model_tag: str, env: dict[str, str] | None = None, *, host: str = "127.0.0.1",
        wait: bool = False,
    ) -> BentoServer:  # fmt: skip
        if wait:
            server = start_bento_server(model_tag, tmp_path, env, host=host)
        else:
            server = launch_bento_server(model_tag, tmp_path, env, host)
        servers.append(server)
        return server

    return servers, launcher


@pytest.fixture
def bento_launcher(tmp_path: Path) -> Iterator[Callable[..., BentoServer]]:
    """Like bento_server_factory, but the caller decides what to wait for (wait=True: ready)."""
    servers, launcher = _launcher(tmp_path)
    yield launcher
    for server in servers:
        stop_and_reap(server)


def bentoml_build(python: str, args: list[str], model: str, timeout: float) -> str:
    """`bentoml build` as a user runs it, with `python`'s BentoML, packing the stored model
    `model` (TRTLLM_MODEL): the new Bento's tag."""
    result = subprocess.run(
        [python, "-m", "bentoml", "build", *args, "--output", "tag"],
        cwd=ROOT,
        env={**os.environ, "TRTLLM_MODEL": model},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    match = re.search(r"__tag__:(\S+)", result.stdout)
    assert match, result.stdout[-2000:]
    return match.group(1)


@pytest.fixture(scope="module")
def module_bento_launcher(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., BentoServer]]:
    """bento_launcher for servers shared by the tests of one module."""
    servers, launcher = _launcher(tmp_path_factory.mktemp("module-servers"))
    yield launcher
    for server in servers:
        stop_and_reap(server)


@pytest.fixture(scope="module")
def text_route(
    demo_model: str, module_bento_launcher: Callable[..., BentoServer]
) -> Callable[[str], BentoServer]:
    """The demo model served on a text route (`ensemble`, `bls`: their generation returns the
    chosen token's log prob only), one server per route for the whole module."""
    servers: dict[str, BentoServer] = {}

    def server(route: str) -> BentoServer:
        if route not in servers:
            servers[route] = module_bento_launcher(demo_model, {"TRTLLM_ROUTE": route}, wait=True)
        return servers[route]

    return server
