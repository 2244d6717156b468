"""StubWatch against real processes: copies of `sleep` named like the Python backend's stub,
started by this test process the way tritonserver starts its stubs."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorrtllm_backend.triton.stub_watch import StubWatch, python_stubs


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


def wait_zombie(pid: int) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
            return
        time.sleep(0.01)
    raise AssertionError(f"{pid} did not die")


def test_stubs_are_found_among_descendants_only(stub_binary: Path, processes: list) -> None:
    stub = start(processes, str(stub_binary), "60")
    other = start(processes, "sleep", "60")
    # a grandchild, as under mpirun: bash runs the stub and waits for it
    shell = start(processes, "bash", "-c", f"{stub_binary} 60 & wait")
    deadline = time.monotonic() + 5
    while len(found := python_stubs(os.getpid())) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
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


def test_a_stub_dead_before_the_first_look_is_reported(stub_binary: Path, processes: list) -> None:
    stub = start(processes, str(stub_binary), "60")
    stub.kill()
    wait_zombie(stub.pid)
    assert StubWatch(os.getpid()).dead() == [f"? (pid {stub.pid})"]


def test_without_proc_there_is_nothing_to_watch(tmp_path: Path) -> None:
    assert python_stubs(1, tmp_path / "no-proc") == {}
    assert StubWatch(1, tmp_path / "no-proc").dead() == []
