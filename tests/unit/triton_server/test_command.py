"""tritonserver's command line (triton/command.py): the parent-death wrapper. build_command's
rank layout is checked in tests/integration/test_server.py, next to the real tritonserver."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from tensorrtllm_backend.triton import command
from tensorrtllm_backend.triton.command import with_death_signal


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
    thread = threading.Thread(
        target=lambda: spawned.append(subprocess.Popen(with_death_signal(["sleep", "60"])))
    )
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
