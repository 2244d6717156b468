"""StubWatch against real processes: copies of `sleep` named like the Python backend's stub,
started by this test process the way tritonserver starts its stubs."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorrtllm_backend.triton.stub_watch import STUB_COMM, StubWatch, python_stubs
from tests.waiting import wait_for


@pytest.fixture
def stub_binary(tmp_path: Path) -> Path:
    binary = tmp_path / "triton_python_backend_stub"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
    return binary


@pytest.fixture
def model_stub(tmp_path: Path) -> tuple[Path, Path]:
    """A stub that runs a model file, as the real one does: a copy of bash running a script
    at <repository>/<model>/1/model.py."""
    binary = tmp_path / "shell" / "triton_python_backend_stub"
    binary.parent.mkdir()
    shutil.copy(shutil.which("bash") or "/bin/bash", binary)
    model = tmp_path / "repository" / "postprocessing" / "1" / "model.py"
    model.parent.mkdir(parents=True)
    model.write_text("sleep 60\n")
    return binary, model


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        with contextlib.suppress(ProcessLookupError):  # also what a killed shell left running
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def start(processes: list[subprocess.Popen[bytes]], *command: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(command, start_new_session=True)
    processes.append(process)
    return process


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def wait_zombie(pid: int) -> None:
    assert wait_for(lambda: state_of(pid) == "Z", 30, 0.01), f"{pid} did not die"


def comm_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[0].partition("(")[2]


def gone_or_zombie(pid: int) -> bool:
    try:
        return state_of(pid) == "Z"
    except FileNotFoundError:
        return True


def test_stubs_are_found_among_descendants_only(stub_binary: Path, processes: list) -> None:
    stub = start(processes, str(stub_binary), "60")
    other = start(processes, "sleep", "60")
    # a grandchild, as under mpirun: bash runs the stub and waits for it
    shell = start(processes, "bash", "-c", f"{stub_binary} 60 & wait")

    def both() -> dict[int, bool]:
        found = python_stubs(os.getpid())
        return found if len(found) >= 2 else {}

    found = wait_for(both, 30, 0.01)
    assert found[stub.pid] is True
    assert other.pid not in found and shell.pid not in found
    assert len(found) == 2
    assert python_stubs(other.pid) == {}


@pytest.mark.parametrize("rescan_every", [1, 30])
def test_a_dead_stub_is_reported_once(
    stub_binary: Path, model_stub: tuple[Path, Path], processes: list, rescan_every: int
) -> None:
    first = start(processes, *map(str, model_stub))
    second = start(processes, str(stub_binary), "60")
    watch = StubWatch(os.getpid(), rescan_every=rescan_every)
    assert watch.dead() == []

    first.kill()
    wait_zombie(first.pid)  # not reaped yet, as tritonserver leaves it
    assert watch.dead() == [f"postprocessing (pid {first.pid})"]
    assert watch.dead() == []  # reported once

    second.kill()
    second.wait()  # reaped: gone from /proc
    assert watch.dead() == [f"? (pid {second.pid})"]  # no model argument
    assert watch.dead() == []


def test_children_of_a_stub_are_not_stubs(tmp_path: Path, processes: list) -> None:
    """A model that forks (multiprocessing; a subprocess before its exec) has children named like
    its stub: their exit is the model's business, not a dead stub. A copy of bash named like the
    stub runs a subshell, itself a copy of bash with the stub's name, that the test then kills."""
    binary = tmp_path / "triton_python_backend_stub"
    shutil.copy(shutil.which("bash") or "/bin/bash", binary)
    child_pid = tmp_path / "child.pid"
    script = tmp_path / "model.py"
    script.write_text(
        f"(echo $BASHPID > {child_pid}.tmp; mv {child_pid}.tmp {child_pid}; sleep 60; :) &\nsleep 60\n"
    )
    stub = start(processes, str(binary), str(script))
    assert wait_for(child_pid.exists, 30), "the stub did not start its subshell"
    child = int(child_pid.read_text())
    assert state_of(child) != "Z" and comm_of(child) == STUB_COMM

    watch = StubWatch(os.getpid(), rescan_every=1)
    assert sorted(python_stubs(os.getpid())) == [stub.pid]
    assert watch.dead() == []
    os.kill(child, signal.SIGKILL)
    assert wait_for(lambda: gone_or_zombie(child), 30), "the subshell did not die"
    assert watch.dead() == []
    assert python_stubs(os.getpid()) == {stub.pid: True}


def test_a_stub_dead_before_the_first_look_is_reported(stub_binary: Path, processes: list) -> None:
    stub = start(processes, str(stub_binary), "60")
    stub.kill()
    wait_zombie(stub.pid)
    assert StubWatch(os.getpid()).dead() == [f"? (pid {stub.pid})"]


def test_without_proc_there_is_nothing_to_watch(tmp_path: Path) -> None:
    assert python_stubs(1, tmp_path / "no-proc") == {}
    assert StubWatch(1, tmp_path / "no-proc").dead() == []
