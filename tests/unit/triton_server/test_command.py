"""tritonserver's command line and environment (triton/command.py): the parent-death wrapper, the
control-plane secret, and what the stubs inherit. build_command's rank layout is checked in
tests/integration/test_server.py, next to the real tritonserver."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tensorrtllm_backend.triton import command
from tensorrtllm_backend.triton.command import (
    CONTROL_HEADER,
    PROJECT_ROOT,
    ControlSecret,
    TritonPorts,
    TritonServerConfig,
    build_command,
    default_python_paths,
    tritonserver_environment,
    with_death_signal,
)
from tensorrtllm_backend.triton.install import TritonInstallation
from tensorrtllm_backend.triton.stub_python import StubPython

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


def _stub(version: tuple[int, int], home: str) -> StubPython:
    return StubPython(
        "libpython.so.1.0", Path("/lib/libpython.so.1.0"), Path(home), None, version, False
    )


def test_a_stub_of_another_python_gets_our_package_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's packages are built for its own Python: a stub of another version (the
    Bento's image, where BentoML once made a 3.11 venv next to NGC's 3.12) must not see them."""
    monkeypatch.setattr(command, "_site_packages", lambda: ["/venv/lib/python3.11/site-packages"])
    other = (sys.version_info.major, sys.version_info.minor + 1)
    assert default_python_paths(_stub(other, "/usr")) == [str(PROJECT_ROOT)]
    env = tritonserver_environment(INSTALLATION, None, _stub(other, "/usr"))
    assert env["TRTLLM_BACKEND_PYTHONPATH"] == str(PROJECT_ROOT)


def test_a_stub_on_this_installation_gets_only_what_it_lacks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On the service's own installation (NGC's image) the stub already has its site-packages,
    behind its standard library: only a venv's go first. Another installation of the same
    version (Debian's 3.11 next to pyenv's) gets all of them, as before."""
    venv, base = tmp_path / "venv-site", tmp_path / "base-site"
    monkeypatch.setattr(command, "_site_packages", lambda: [str(venv), str(base)])
    monkeypatch.setattr(command, "_installation_site_packages", lambda: {str(base.resolve())})
    version = (sys.version_info.major, sys.version_info.minor)
    assert default_python_paths(_stub(version, sys.base_prefix)) == [str(venv), str(PROJECT_ROOT)]
    assert default_python_paths(_stub(version, "/opt/another-python")) == [
        str(venv),
        str(base),
        str(PROJECT_ROOT),
    ]
    assert default_python_paths(None) == [str(venv), str(base), str(PROJECT_ROOT)]


def test_the_installations_site_packages_are_not_the_venvs() -> None:
    own = command._installation_site_packages()
    assert own and all(Path(p).is_absolute() for p in own)
    if sys.prefix != sys.base_prefix:  # the tests run in .venv
        assert not [p for p in own if p.startswith(str(Path(sys.prefix).resolve()))]
