"""Security on a real `bentoml serve`: Triton on loopback only, its control plane closed by a
per-start secret and the API key kept out of its environment, the optional API key on every API
(native and OpenAI) with health and metrics open, the in-flight bound (429 + Retry-After),
unguessable request ids, and neither shell=True nor preexec_fn anywhere in the repository."""

from __future__ import annotations

import ipaddress
import re
import threading
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING

import anthropic
import bentoml
import httpx
import openai
import psutil
import pytest
import tritonclient.grpc as grpcclient
from bentoml.exceptions import BentoMLException
from test_server import echo, kill_all, process_tree, write_echo_repository
from tritonclient.utils import InferenceServerException

from tensorrtllm_backend.triton.command import TritonServerConfig
from tensorrtllm_backend.triton.supervisor import TritonSupervisor
from tests.waiting import wait_for

if TYPE_CHECKING:
    from conftest import BentoServer  # tests/integration/conftest.py

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KEY = "test-key-3f9a1c"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "trtllm-slow"
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def secured(module_bento_launcher: Callable[..., BentoServer], slow_synthetic_model: str):
    """BentoML bound to all interfaces (as in a container), an API key, at most 2 in flight."""
    return module_bento_launcher(
        slow_synthetic_model,
        {"TRTLLM_API_KEY": KEY, "TRTLLM_MAX_IN_FLIGHT": "2"},
        host="0.0.0.0",  # all interfaces: the test checks only this port is exposed
        wait=True,
    )


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # gRPC binds ::ffff:127.0.0.1
    return bool((mapped or address).is_loopback)


def _listening(process: psutil.Process) -> list[tuple[str, int]]:
    try:
        connections = process.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
    return [(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN]


def test_only_the_bentoml_port_listens_beyond_loopback(secured: BentoServer) -> None:
    port = int(secured.url.rsplit(":", 1)[1])
    tritons = [p for p in secured.tritons() if "tritonserver" in p.cmdline()[0]]
    assert len(tritons) == 1
    triton_sockets = _listening(tritons[0])
    assert len(triton_sockets) >= 3, triton_sockets  # grpc, http, metrics
    assert all(_is_loopback(ip) for ip, _ in triton_sockets), triton_sockets
    processes = [psutil.Process(secured.process.pid), *psutil.Process(
        secured.process.pid).children(recursive=True)]  # fmt: skip
    exposed = {
        (ip, p) for process in processes for ip, p in _listening(process)
        if not _is_loopback(ip)
    }  # fmt: skip
    assert exposed == {("0.0.0.0", port)}, exposed


PROTECTED = [
    ("POST", "/generate", {"prompt": "hi", "max_tokens": 2}),
    ("POST", "/generate_text", {"prompt": "hi", "max_tokens": 2}),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}),
    ("POST", "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("GET", "/v1/models", None),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body"), PROTECTED, ids=[p for _, p, _ in PROTECTED])
def test_api_key_is_required(secured: BentoServer, method: str, path: str, body) -> None:
    url = secured.url + path
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        response = httpx.request(method, url, json=body, headers=headers, timeout=TIMEOUT)
        assert response.status_code == 401, (headers, response.text)
        assert "api key" in response.text.lower()
        assert response.headers.get("www-authenticate") == "Bearer"
    response = httpx.request(method, url, json=body, headers=AUTH, timeout=TIMEOUT)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", ["/readyz", "/livez", "/health", "/metrics", "/schema.json"])
def test_health_and_metrics_stay_open(secured: BentoServer, path: str) -> None:
    assert httpx.get(secured.url + path, timeout=TIMEOUT).status_code == 200


def test_clients_send_the_key(secured: BentoServer) -> None:
    with bentoml.SyncHTTPClient(secured.url, token=KEY, timeout=TIMEOUT) as client:
        result = client.generate_text(prompt="hi", max_tokens=3, ignore_eos=True)
        assert result["usage"]["completion_tokens"] == 3
    api = openai.OpenAI(base_url=f"{secured.url}/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT)
    assert [m.id for m in api.models.list().data] == [MODEL]
    chat = api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert chat.usage.completion_tokens == 2
    wrong = openai.OpenAI(base_url=f"{secured.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_a_bentoml_client_without_the_key_is_told_the_header_to_send(secured: BentoServer) -> None:
    """BentoML's client reads /schema.json (open) before its first call: that call gets the 401,
    and the client raises it with the body, which names the header."""
    with bentoml.SyncHTTPClient(secured.url, timeout=TIMEOUT) as client:
        with pytest.raises(BentoMLException) as whole:
            client.generate_text(prompt="hi", max_tokens=2)
        with pytest.raises(BentoMLException) as streamed:
            list(client.generate(prompt="hi", max_tokens=2))
    for caught in (whole, streamed):
        assert caught.value.error_code == HTTPStatus.UNAUTHORIZED
        assert "Authorization: Bearer <key>" in str(caught.value), caught.value
    with bentoml.SyncHTTPClient(secured.url, token=KEY, timeout=TIMEOUT) as client:
        chunks = list(client.generate(prompt="hi", max_tokens=3, ignore_eos=True))
    assert chunks and all(isinstance(chunk, str) for chunk in chunks), chunks


def test_anthropic_clients_send_the_key_as_x_api_key(secured: BentoServer) -> None:
    api = anthropic.Anthropic(base_url=secured.url, api_key=KEY, max_retries=0, timeout=TIMEOUT)
    counted = api.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens > 0
    wrong = anthropic.Anthropic(base_url=secured.url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["error"]["type"] == "authentication_error"


def test_request_ids_are_unguessable(secured: BentoServer) -> None:
    api = openai.OpenAI(base_url=f"{secured.url}/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT)
    ids = [api.completions.create(model=MODEL, prompt="hi", max_tokens=1).id for _ in range(4)]
    assert len(set(ids)) == len(ids)
    for request_id in ids:
        hex_part = request_id.split("-", 1)[1]
        assert re.fullmatch(r"[0-9a-f]{24,}", hex_part), request_id  # >= 96 random bits
    # not a counter: consecutive ids share no long common prefix
    as_ints = sorted(int(i.split("-", 1)[1], 16) for i in ids)
    assert all(b - a > 2**32 for a, b in zip(as_ints, as_ints[1:], strict=False))


def test_third_concurrent_stream_gets_429_with_retry_after(secured: BentoServer) -> None:
    started = [threading.Event(), threading.Event()]
    statuses: list[int] = []

    def stream(index: int) -> None:
        body = {"prompt": "hi", "max_tokens": 60, "ignore_eos": True}  # ~3 s at 50 ms/token
        with httpx.stream(
            "POST", f"{secured.url}/generate", json=body, headers=AUTH, timeout=TIMEOUT
        ) as response:
            statuses.append(response.status_code)
            for _ in response.iter_raw():
                started[index].set()
        started[index].set()

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    assert all(event.wait(20) for event in started)
    third = httpx.post(
        f"{secured.url}/generate_text", json={"prompt": "hi", "max_tokens": 2}, headers=AUTH,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert third.status_code == 429, third.text
    assert int(third.headers["retry-after"]) >= 1
    assert "in flight" in third.text
    openai_third = httpx.post(
        f"{secured.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
        headers=AUTH, timeout=TIMEOUT,
    )  # fmt: skip
    assert openai_third.status_code == 429
    assert openai_third.json()["error"]["type"] == "rate_limit_error"
    for thread in threads:
        thread.join(30)
    assert statuses == [200, 200]

    def answered() -> httpx.Response | None:
        again = httpx.post(
            f"{secured.url}/generate_text", json={"prompt": "hi", "max_tokens": 2}, headers=AUTH,
            timeout=TIMEOUT,
        )  # fmt: skip
        return again if again.status_code == 200 else None

    assert wait_for(answered, 30, 0.2), "the in-flight slots were not free again"


def test_triton_and_its_stubs_never_see_the_api_key(secured: BentoServer) -> None:
    tritons = secured.tritons()
    assert {p.name() for p in tritons} >= {"tritonserver", "triton_python_backend_stub"}
    for process in tritons:
        environment = process.environ()
        assert "TRTLLM_API_KEY" not in environment, process
        assert not [name for name, value in environment.items() if KEY in value], process


@pytest.fixture(scope="module")
def throwaway_triton(tmp_path_factory: pytest.TempPathFactory):
    """A tritonserver of its own (the echo model, loaded explicitly) whose models the tests may
    unload."""
    root = tmp_path_factory.mktemp("control-plane")
    config = TritonServerConfig(
        model_repository=write_echo_repository(root / "repo"),
        models=("echo",),
        startup_timeout_s=60,
        log_dir=root / "logs",
        watch_stubs=False,  # the unloads end the echo stub; that is not a stub dying
    )
    supervisor = TritonSupervisor(config)
    started: list[psutil.Process] = []
    try:
        supervisor.start()
        started = process_tree(supervisor.pid)
        yield supervisor
    finally:
        supervisor.stop()
        kill_all(started)


RESTRICTED_HTTP = [
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/echo/load"),
    ("GET", "/v2/logging"),
    ("GET", "/v2/trace/setting"),
    ("GET", "/v2/systemsharedmemory/status"),
]


@pytest.mark.parametrize(("method", "path"), RESTRICTED_HTTP, ids=[p for _, p in RESTRICTED_HTTP])
def test_triton_control_apis_need_the_secret(throwaway_triton, method: str, path: str) -> None:
    url = throwaway_triton.http_url + path
    for headers in ({}, {"trtllm-triton-control": "guess"}):
        refused = httpx.request(method, url, headers=headers, timeout=TIMEOUT)
        assert refused.status_code == 403, refused.text
        assert "restricted" in refused.text
    allowed = httpx.request(
        method, url, headers=throwaway_triton.control.http_headers, timeout=TIMEOUT
    )
    assert allowed.status_code == 200, allowed.text


def test_inference_health_and_metadata_stay_open(throwaway_triton) -> None:
    http = throwaway_triton.http_url
    for path in (
        "/v2/health/ready",
        "/v2/health/live",
        "/v2/models/echo",
        "/v2/models/echo/config",
        "/v2/models/echo/stats",
    ):
        assert httpx.get(http + path, timeout=TIMEOUT).status_code == 200, path
    assert echo(throwaway_triton.grpc_url, [1.0, 2.5]) == [2.0, 5.0]


def test_model_unload_without_the_secret_is_refused(throwaway_triton) -> None:
    """What a process on the host's loopback (a sidecar in the pod) could do to the model."""
    control = throwaway_triton.control
    http = throwaway_triton.http_url
    with grpcclient.InferenceServerClient(throwaway_triton.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="restricted"):
            client.unload_model("echo")
        refused = httpx.post(f"{http}/v2/repository/models/echo/unload", timeout=TIMEOUT)
        assert refused.status_code == 403, refused.text
        assert client.is_model_ready("echo")

        client.unload_model("echo", headers=control.grpc_headers)
        assert wait_for(lambda: not client.is_model_ready("echo"), 10)
        client.load_model("echo", headers=control.grpc_headers)
        assert client.is_model_ready("echo")
        unloaded = httpx.post(
            f"{http}/v2/repository/models/echo/unload", headers=control.http_headers,
            timeout=TIMEOUT,
        )  # fmt: skip
        assert unloaded.status_code == 200, unloaded.text
        assert wait_for(lambda: not client.is_model_ready("echo"), 10)
        client.load_model("echo", headers=control.grpc_headers)
    assert echo(throwaway_triton.grpc_url, [3.0]) == [6.0]


def test_the_secret_is_fresh_at_each_start_and_never_logged(throwaway_triton) -> None:
    secret = throwaway_triton.control.value
    assert secret not in throwaway_triton.log_path.read_text(errors="replace")
    triton = psutil.Process(throwaway_triton.pid)
    for process in [triton, *triton.children(recursive=True)]:
        try:
            environment = process.environ()
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue  # a stub the unloads ended: gone, with its environment
        assert not [v for v in environment.values() if secret in v], process
    throwaway_triton.restart("a test wants a new secret")
    assert wait_for(lambda: throwaway_triton.pid != triton.pid, 60)
    assert throwaway_triton.wait_ready(60)
    assert throwaway_triton.control.value != secret
    refused = httpx.post(
        f"{throwaway_triton.http_url}/v2/repository/index",
        headers={"trtllm-triton-control": secret}, timeout=TIMEOUT,
    )  # fmt: skip
    assert refused.status_code == 403  # the last run's secret opens nothing


def _repository_lines(needle: re.Pattern[str]) -> list[str]:
    """Lines of the repository's Python files that match `needle` (this file excepted: it
    names the patterns it looks for)."""
    offenders = []
    for path in ROOT.rglob("*.py"):
        relative = path.relative_to(ROOT)
        if relative.parts[0].startswith(".") or "site-packages" in relative.parts:
            continue
        if path == Path(__file__).resolve():
            continue  # this file names the pattern it looks for
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if needle.search(line):
                offenders.append(f"{relative}:{number}: {line.strip()}")
    return offenders


def test_no_shell_true_anywhere() -> None:
    offenders = _repository_lines(re.compile(r"shell\s*=\s*True|os\.system\(|os\.popen\("))
    assert not offenders, offenders


def test_no_preexec_fn_anywhere() -> None:
    """Python run between fork and exec in a multithreaded process can deadlock the child; a
    parent-death signal comes from `setpriv --pdeathsig` (command.with_death_signal)."""
    offenders = _repository_lines(re.compile(r"preexec_fn\s*="))
    assert not offenders, offenders
