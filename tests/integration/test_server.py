"""TritonSupervisor against a real tritonserver (nvidia-pytriton's binary) serving a tiny python
"echo" model: start/ready, loopback-only ports, restart after a crash, clean stop, startup errors
with the log tail, no orphan when the owning process is SIGKILLed; plus build_command's argv."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from tensorrtllm_backend.triton.command import (
    TritonPorts,
    TritonServerConfig,
    build_command,
    find_free_port,
)
from tensorrtllm_backend.triton.install import (
    TritonError,
    TritonInstallation,
    TritonStartupError,
    find_tritonserver,
)
from tensorrtllm_backend.triton.supervisor import ServerState, TritonSupervisor
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """\
import os
import sys

# The Triton python stub may run a different interpreter than the service's venv and ignores
# PYTHONPATH: the supervisor passes the paths to add (venv site-packages, our package's parent).
for _path in reversed(os.environ.get("TRTLLM_BACKEND_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)
"""

ECHO_MODEL = PRELUDE + textwrap.dedent(
    """
    import numpy as np  # noqa: E402  (from the venv: proves the prelude worked)
    import triton_python_backend_utils as pb_utils  # noqa: E402


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                out = pb_utils.Tensor("OUTPUT0", np.asarray(data, dtype=np.float32) * 2)
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            return responses
    """
)

ECHO_CONFIG = """\
name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def write_echo_repository(root: Path, config: str = ECHO_CONFIG) -> Path:
    model = root / "echo"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(config)
    (model / "1" / "model.py").write_text(ECHO_MODEL)
    return root


def process_tree(pid: int | None) -> list[psutil.Process]:
    """pid and everything it started (tritonserver and its python stubs)."""
    if pid is None:
        return []
    try:
        parent = psutil.Process(pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """The processes still running after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(processes)


def kill_all(processes: list[psutil.Process]) -> None:
    for process in alive(processes):
        with contextlib.suppress(psutil.Error):
            process.kill()


def listening_ports(pid: int) -> dict[int, str]:
    """TCP port -> bound address of every listening socket of pid."""
    connections = psutil.Process(pid).net_connections(kind="tcp")
    return {c.laddr.port: c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN}


def is_loopback(address: str) -> bool:
    """gRPC listens on an IPv6 socket: 127.0.0.1 shows up as ::ffff:127.0.0.1 there."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def echo(url: str, values: list[float]) -> list[float]:
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput("INPUT0", [len(values)], "FP32")
        tensor.set_data_from_numpy(np.asarray(values, dtype=np.float32))
        result = client.infer("echo", [tensor], client_timeout=10)
        return [float(x) for x in result.as_numpy("OUTPUT0")]


@pytest.fixture(scope="module")
def echo_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_echo_repository(tmp_path_factory.mktemp("echo-repo"))


@pytest.fixture(scope="module")
def pinned_ports() -> TritonPorts:
    return TritonPorts(grpc=find_free_port(), http=find_free_port(), metrics=find_free_port())


@pytest.fixture(scope="module")
def states() -> list[ServerState]:
    """Every state the module's supervisor reported through on_state_change."""
    return []


@pytest.fixture(scope="module")
def supervisor(
    echo_repository: Path,
    pinned_ports: TritonPorts,
    states: list[ServerState],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TritonSupervisor]:
    """One supervised tritonserver on pinned ports, shared by this module's lifecycle tests."""
    config = TritonServerConfig(
        model_repository=echo_repository,
        grpc_port=pinned_ports.grpc,
        http_port=pinned_ports.http,
        metrics_port=pinned_ports.metrics,
        startup_timeout_s=60,
        log_dir=tmp_path_factory.mktemp("echo-logs"),
    )
    sup = TritonSupervisor(config, on_state_change=states.append)
    seen: list[psutil.Process] = []
    try:
        sup.start()
        seen += process_tree(sup.pid)
        yield sup
    finally:
        seen += process_tree(sup.pid)
        sup.stop()
        kill_all(seen)


@pytest.mark.integration
def test_starts_ready_with_pinned_ports_on_loopback_only(
    supervisor: TritonSupervisor, pinned_ports: TritonPorts, states: list[ServerState]
) -> None:
    assert supervisor.state is ServerState.READY
    assert supervisor.is_ready()
    assert states[:2] == [ServerState.STARTING, ServerState.READY]
    assert supervisor.ports == pinned_ports
    assert supervisor.grpc_url == f"127.0.0.1:{pinned_ports.grpc}"
    ours = {pinned_ports.grpc, pinned_ports.http, pinned_ports.metrics}

    def all_listening() -> dict[int, str]:
        # Triton can answer ready before its metrics endpoint listens (seen on a busy host).
        found = listening_ports(supervisor.pid or 0)
        return found if ours <= set(found) else {}

    listening = wait_for(all_listening, 30)
    assert ours <= set(listening), listening_ports(supervisor.pid or 0)
    assert all(is_loopback(ip) for ip in listening.values()), f"not loopback only: {listening}"


@pytest.mark.integration
def test_python_model_runs_with_the_venv_on_its_path(supervisor: TritonSupervisor) -> None:
    assert echo(supervisor.grpc_url, [1.0, 2.5]) == [2.0, 5.0]
    stubs = [p for p in process_tree(supervisor.pid) if "backend_stub" in " ".join(p.cmdline())]
    assert stubs, "the echo model should run in a python backend stub"
    assert "TRTLLM_BACKEND_PYTHONPATH" in psutil.Process(supervisor.pid).environ()


@pytest.mark.integration
def test_metrics_endpoint_is_served(supervisor: TritonSupervisor) -> None:
    with urllib.request.urlopen(supervisor.metrics_url, timeout=5) as response:
        body = response.read().decode()
    assert 'nv_inference_request_success{model="echo"' in body


@pytest.mark.integration
def test_killed_tritonserver_is_restarted_on_the_same_ports(
    supervisor: TritonSupervisor, pinned_ports: TritonPorts, states: list[ServerState]
) -> None:
    old = process_tree(supervisor.pid)
    old_pid = supervisor.pid
    restarts = supervisor.restarts
    os.kill(old_pid, signal.SIGKILL)
    assert wait_for(lambda: supervisor.restarts == restarts + 1, 10), supervisor.state
    assert supervisor.wait_ready(60), supervisor.log_tail()
    assert supervisor.pid != old_pid
    assert supervisor.ports == pinned_ports
    assert supervisor.is_ready()
    assert states[-2:] == [ServerState.RESTARTING, ServerState.READY]
    assert echo(supervisor.grpc_url, [3.0]) == [6.0]
    assert wait_gone(old, 10) == [], "the crashed server's python stubs were left running"


@pytest.mark.integration
def test_a_winding_down_service_does_not_restart_tritonserver(
    echo_repository: Path, tmp_path: Path
) -> None:
    """`bentoml serve` sends its stop signal to the worker's children too: tritonserver stops
    while the worker drains its requests. That is the shutdown, not a crash to recover from."""
    states: list[ServerState] = []
    config = TritonServerConfig(
        model_repository=echo_repository, startup_timeout_s=60, log_dir=tmp_path
    )
    supervisor = TritonSupervisor(config, on_state_change=states.append)
    supervisor.start()
    started = process_tree(supervisor.pid)
    try:
        assert len(started) >= 2  # tritonserver + the echo model's stub
        supervisor.wind_down()
        supervisor.restart("a request for a restart while stopping is ignored")
        assert supervisor.is_ready()
        os.kill(supervisor.pid, signal.SIGTERM)  # as the arbiter sends it
        assert wait_for(lambda: supervisor.state is ServerState.STOPPED, 30), supervisor.state
        assert supervisor.restarts == 0
        assert ServerState.RESTARTING not in states
        assert wait_gone(started, 10) == []
    finally:
        supervisor.stop()
        kill_all(started)


@pytest.mark.integration
def test_stop_leaves_no_process(supervisor: TritonSupervisor) -> None:
    started = process_tree(supervisor.pid)
    assert len(started) >= 2  # tritonserver + the echo model's stub
    supervisor.stop()
    assert wait_gone(started, 5) == []
    assert supervisor.state is ServerState.STOPPED
    assert not supervisor.is_ready()
    assert supervisor.pid is None


@pytest.fixture(scope="module")
def broken_start(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Start a repository whose config.pbtxt does not parse; record what the caller sees."""
    tmp_path = tmp_path_factory.mktemp("broken")
    repository = write_echo_repository(
        tmp_path / "repo", ECHO_CONFIG.replace('backend: "python"', 'backend: "python" oops {')
    )
    sup = TritonSupervisor(
        TritonServerConfig(model_repository=repository, startup_timeout_s=60, log_dir=tmp_path)
    )
    spawned: list[psutil.Process] = []
    original_spawn = sup._spawn

    def recording_spawn(ports: TritonPorts):  # type: ignore[no-untyped-def]
        run = original_spawn(ports)
        spawned.extend(process_tree(run.process.pid))
        return run

    sup._spawn = recording_spawn  # type: ignore[method-assign]
    error: BaseException | None = None
    try:
        sup.start()
    except BaseException as raised:  # checked by the tests below
        error = raised
    finally:
        sup.stop()
        left = wait_gone(spawned, 5)
        kill_all(spawned)
    return {"error": error, "state": sup.state, "spawned": spawned, "left": left}


@pytest.mark.integration
def test_broken_config_raises_startup_error_with_log_tail(broken_start: dict) -> None:
    error = broken_start["error"]
    assert isinstance(error, TritonStartupError), error
    message = str(error)
    assert "exited with code 1 before it was ready" in message
    assert "Last lines of its log" in message
    assert "failed to load all models" in message  # the log's last line
    assert broken_start["state"] is ServerState.STOPPED
    assert broken_start["spawned"] and broken_start["left"] == []


@pytest.mark.integration
def test_startup_error_names_the_broken_model(broken_start: dict) -> None:
    """Triton prints its ~30-line options table after the real error: a plain 40-line tail shows
    the table and "failed to load all models", but not which model failed or why."""
    message = str(broken_start["error"])
    assert "Poll failed for model directory 'echo'" in message
    assert 'no field named "oops"' in message


@pytest.mark.integration
def test_missing_repository_is_a_startup_error(tmp_path: Path) -> None:
    sup = TritonSupervisor(TritonServerConfig(model_repository=tmp_path / "nope", log_dir=tmp_path))
    with pytest.raises(TritonStartupError, match="is not a directory"):
        sup.start()
    assert sup.pid is None


OWNER_SCRIPT = """
import sys, time
from pathlib import Path
from tensorrtllm_backend.triton.supervisor import TritonServerConfig, TritonSupervisor

sup = TritonSupervisor(TritonServerConfig(model_repository=Path(sys.argv[1]), startup_timeout_s=60))
sup.start()
print(sup.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.integration
def test_tritonserver_dies_with_its_sigkilled_owner(echo_repository: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, str(echo_repository)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    tree: list[psutil.Process] = []
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline().decode().strip()
        assert line.isdigit(), f"the owner did not report a tritonserver pid: {line!r}"
        triton = psutil.Process(int(line))
        assert "tritonserver" in " ".join(triton.cmdline())
        tree = process_tree(triton.pid)
        owner.kill()  # SIGKILL: no handler, no atexit, no on_shutdown
        owner.wait(10)
        assert wait_gone([triton], 10) == [], "tritonserver outlived its SIGKILLed owner"
        # Orphaned python stubs notice their dead parent on their own (~10 s); the wait ends as
        # soon as they are gone, and a stub that never notices stays for good.
        assert wait_gone(tree, 60) == [], "python stubs outlived their tritonserver"
    finally:
        with contextlib.suppress(ProcessLookupError):
            owner.kill()
        owner.wait(10)
        kill_all(tree)


# --- argv (no process) ---------------------------------------------------------------------------


def _split_app_contexts(argv: list[str]) -> list[list[str]]:
    contexts: list[list[str]] = [[]]
    for arg in argv:
        if arg == ":":
            contexts.append([])
        else:
            contexts[-1].append(arg)
    return contexts


def test_build_command_single_rank(tmp_path: Path) -> None:
    installation = TritonInstallation(Path("/opt/tritonserver/bin/tritonserver"), tmp_path)
    config = TritonServerConfig(model_repository=tmp_path / "repo", log_verbose=1)
    argv = build_command(installation, config, TritonPorts(9001, 9000, 9002))
    assert argv[0] == "/opt/tritonserver/bin/tritonserver"
    assert f"--model-repository={tmp_path / 'repo'}" in argv
    assert f"--backend-directory={tmp_path}" in argv
    for flag in ("--grpc-address=127.0.0.1", "--http-address=127.0.0.1",
                 "--metrics-address=127.0.0.1", "--grpc-port=9001", "--http-port=9000",
                 "--metrics-port=9002", "--exit-timeout-secs=3", "--log-verbose=1"):  # fmt: skip
        assert flag in argv
    assert "mpirun" not in argv and ":" not in argv


def test_build_command_loads_only_the_listed_models(tmp_path: Path) -> None:
    installation = TritonInstallation(Path("/opt/tritonserver/bin/tritonserver"))
    everything = build_command(
        installation, TritonServerConfig(model_repository=tmp_path), TritonPorts(1, 2, 3)
    )
    assert not [a for a in everything if a.startswith(("--model-control-mode", "--load-model"))]
    config = TritonServerConfig(model_repository=tmp_path, models=("tensorrt_llm",))
    argv = build_command(installation, config, TritonPorts(1, 2, 3))
    assert "--model-control-mode=explicit" in argv and "--load-model=tensorrt_llm" in argv


def test_build_command_two_ranks_uses_mpirun(tmp_path: Path) -> None:
    installation = TritonInstallation(Path("/opt/tritonserver/bin/tritonserver"))
    config = TritonServerConfig(model_repository=tmp_path, world_size=2)
    argv = build_command(installation, config, TritonPorts(9001, 9000, 9002))
    assert argv[0] == "mpirun"
    head, *ranks = _split_app_contexts(argv)
    assert len(ranks) == 1  # rank 0's context starts inside head, after mpirun's own options
    first = head[head.index("-n") :]
    contexts = [first, *ranks]
    assert len(contexts) == 2
    for rank, context in enumerate(contexts):
        assert context[:3] == ["-n", "1", "/opt/tritonserver/bin/tritonserver"]
        assert f"--model-repository={tmp_path}" in context
        assert f"--backend-config=python,shm-region-prefix-name=prefix{rank}_" in context
    rank0, rank1 = contexts
    assert "--grpc-port=9001" in rank0 and "--http-port=9000" in rank0
    assert "--metrics-port=9002" in rank0
    assert not [a for a in rank1 if a.startswith(("--grpc-port", "--http-port", "--metrics-port"))]
    assert {"--model-control-mode=explicit", "--load-model=tensorrt_llm", "--allow-http=false",
            "--allow-grpc=false", "--allow-metrics=false"} <= set(rank1)  # fmt: skip
    prefixes = {a for a in argv if "shm-region-prefix-name" in a}
    assert len(prefixes) == 2


def test_build_command_rejects_zero_world_size(tmp_path: Path) -> None:
    installation = TritonInstallation(Path("/opt/tritonserver/bin/tritonserver"))
    config = TritonServerConfig(model_repository=tmp_path, world_size=0)
    with pytest.raises(ValueError, match="world_size"):
        build_command(installation, config, TritonPorts(1, 2, 3))


# --- locating tritonserver (no process) ----------------------------------------------------------


def test_env_override_must_be_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    not_executable = tmp_path / "tritonserver"
    not_executable.write_text("")
    monkeypatch.setenv("TRTLLM_TRITONSERVER", str(not_executable))
    with pytest.raises(TritonError, match="is not an executable file"):
        find_tritonserver(tmp_path)


def test_pytriton_wheel_is_the_cpu_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRTLLM_TRITONSERVER", raising=False)
    monkeypatch.delenv("TRTLLM_TRITON_BACKEND_DIR", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    if os.access("/opt/tritonserver/bin/tritonserver", os.X_OK):
        pytest.skip("an NGC tritonserver is installed here and takes precedence")
    installation = find_tritonserver(tmp_path)
    assert installation.binary.name == "tritonserver" and "pytriton" in str(installation.binary)
    assert installation.backend_dir is not None
    python_backend = installation.backend_dir / "python"
    names = {p.name for p in python_backend.iterdir()}
    assert names == {
        "libtriton_python.so", "triton_python_backend_utils.py", "triton_python_backend_stub",
    }  # fmt: skip
    assert all((python_backend / name).resolve().is_file() for name in names)
    assert [d.name for d in installation.library_dirs] == ["nvidia_pytriton.libs"]
    assert find_tritonserver(tmp_path) == installation  # the symlink farm is reused


@pytest.mark.integration
def test_python_models_load_under_an_activated_virtualenv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`source .venv/bin/activate` puts the venv's interpreter first on PATH; the stub must not
    take its standard library from there (here: pyenv's 3.11.7 stdlib under Debian's 3.11.2
    libpython broke `import ssl`, and with it transformers, in every python model)."""
    repository = write_echo_repository(tmp_path / "repo")
    model_py = repository / "echo" / "1" / "model.py"
    model_py.write_text(
        model_py.read_text().replace("import numpy", "import ssl  # noqa\nimport numpy")
    )
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    monkeypatch.setenv("PATH", f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ['PATH']}")
    sup = TritonSupervisor(
        TritonServerConfig(model_repository=repository, startup_timeout_s=60, log_dir=tmp_path)
    )
    seen: list[psutil.Process] = []
    try:
        sup.start()
        seen += process_tree(sup.pid)
        assert echo(sup.grpc_url, [1.0]) == [2.0]
        assert "VIRTUAL_ENV" not in psutil.Process(sup.pid).environ()
    finally:
        seen += process_tree(sup.pid)
        sup.stop()
        kill_all(seen)
