"""tritonserver's command line and environment (triton/command.py): the parent-death wrapper, the
control-plane secret, and what the stubs inherit. build_command's rank layout is checked in
tests/integration/test_server.py, next to the real tritonserver."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tensorrtllm_backend.triton import command
from tensorrtllm_backend.triton.command import (
    CONTROL_HEADER,
    ControlSecret,
    TritonPorts,
    TritonServerConfig,
    build_command,
    tritonserver_environment,
    with_death_signal,
)
from tensorrtllm_backend.triton.install import TritonInstallation

INSTALLATION = TritonInstallation(Path("/opt/tritonserver/bin/tritonserver"))


def test_tritonserver_gets_no_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every python stub inherits tritonserver's environment: the service's key stays out."""
    monkeypatch.setenv("TRTLLM_API_KEY", "s3cret-key")
    monkeypatch.setenv("TRTLLM_CPU_ENGINE_ORPHAN_GRACE_S", "7")
    env = tritonserver_environment(INSTALLATION, ["/somewhere"])
    assert "TRTLLM_API_KEY" not in env
    assert not [name for name, value in env.items() if "s3cret-key" in value]
    assert env["TRTLLM_CPU_ENGINE_ORPHAN_GRACE_S"] == "7"  # the stubs' own settings pass


def test_the_secret_restricts_rank_0_and_is_hidden_from_logs(tmp_path: Path) -> None:
    control = ControlSecret()
    assert len(control.value) >= 40 and ControlSecret().value != control.value
    assert control.value not in repr(control)
    config = TritonServerConfig(model_repository=tmp_path, world_size=2)
    argv = build_command(INSTALLATION, config, TritonPorts(1, 2, 3), control)
    restricted = [arg for arg in argv if control.value in arg]
    apis = "model-repository,shared-memory,trace,logging"
    assert restricted == [
        f"--grpc-restricted-protocol={apis}:{CONTROL_HEADER}={control.value}",
        f"--http-restricted-api={apis}:{CONTROL_HEADER}={control.value}",
    ]
    assert argv.index(restricted[0]) < argv.index(":")  # rank 0 only: the others serve no API
    line = control.redact(argv)
    assert control.value not in line and "<secret>" in line
    assert control.grpc_headers == {f"triton-grpc-protocol-{CONTROL_HEADER}": control.value}
    assert control.http_headers == {CONTROL_HEADER: control.value}
    unrestricted = build_command(INSTALLATION, config, TritonPorts(1, 2, 3))
    assert not [arg for arg in unrestricted if "restricted" in arg]


@pytest.fixture
def fresh_wrapper_lookup():
    """with_death_signal looks for setpriv once per process: look again in this test."""
    command._death_signal_wrapper.cache_clear()
    yield
    command._death_signal_wrapper.cache_clear()


@pytest.mark.usefixtures("fresh_wrapper_lookup")
def test_setpriv_sets_the_death_signal() -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("util-linux setpriv is not installed here")
    argv = with_death_signal(["tritonserver", "--x"])
    assert argv[1:] == ["--pdeathsig=KILL", "--", "tritonserver", "--x"]
    assert Path(argv[0]).name == "setpriv"
    assert with_death_signal(["x"], signal.SIGTERM)[1] == "--pdeathsig=TERM"


@pytest.mark.usefixtures("fresh_wrapper_lookup")
def test_the_child_dies_with_the_thread_that_spawned_it() -> None:
    """The supervisor's semantics: the signal fires when the spawning *thread* ends."""
    if shutil.which("setpriv") is None:
        pytest.skip("util-linux setpriv is not installed here")
    spawned: list[subprocess.Popen[bytes]] = []

    def spawn() -> None:
        child = subprocess.Popen(with_death_signal(["sleep", "60"]))
        spawned.append(child)
        # setpriv asks for the signal after the fork: a thread that ended before that would
        # never send it. Once `sleep` runs, setpriv has done so.
        comm = Path(f"/proc/{child.pid}/comm")
        deadline = time.monotonic() + 10
        while comm.read_text().strip() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)

    thread = threading.Thread(target=spawn)
    thread.start()
    thread.join()
    (child,) = spawned
    try:
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


@pytest.mark.usefixtures("fresh_wrapper_lookup")
def test_without_setpriv_the_command_runs_as_is_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(command.shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger=command.__name__):
        assert with_death_signal(["tritonserver", "--x"]) == ["tritonserver", "--x"]
        assert with_death_signal(["mpirun", "-n", "1"]) == ["mpirun", "-n", "1"]
    warnings = [r for r in caplog.records if "setpriv" in r.getMessage()]
    assert len(warnings) == 1
    assert "will not die with a SIGKILLed worker" in warnings[0].getMessage()
