"""StubWatch against real processes: copies of `sleep` named like the Python backend's stub,
started by a stand-in for tritonserver the way tritonserver starts its stubs.

The watch looks at one process's descendants. Not at pytest's: a session-scoped server of the
integration tests runs real stubs under pytest, and they would count too."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
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


# Starts children on request and leaves them unreaped until told, as tritonserver leaves a dead
# stub a zombie until it looks.
_PARENT = """
import json, subprocess, sys
children = {}
for line in sys.stdin:
    verb, argument = json.loads(line)
    if verb == "start":
        child = subprocess.Popen(argument)
        children[child.pid] = child
        print(child.pid, flush=True)
    else:
        children.pop(argument).wait()
        print("reaped", flush=True)
"""


class FakeTritonserver:
    """The parent of the stubs under test, in a process group of its own."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _PARENT],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.process.pid

    def _ask(self, verb: str, argument: object) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps([verb, argument]) + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def start(self, *command: str) -> Child:
        return Child(self, int(self._ask("start", list(command))))

    def reap(self, pid: int) -> None:
        assert self._ask("reap", pid) == "reaped"

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()


@dataclass(frozen=True)
class Child:
    server: FakeTritonserver
    pid: int

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> None:
        self.server.reap(self.pid)


@pytest.fixture
def server() -> Iterator[FakeTritonserver]:
    parent = FakeTritonserver()
    yield parent
    parent.close()


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


def test_stubs_are_found_among_descendants_only(
    stub_binary: Path, server: FakeTritonserver
) -> None:
    stub = server.start(str(stub_binary), "60")
    other = server.start("sleep", "60")
    # a grandchild, as under mpirun: bash runs the stub and waits for it
    shell = server.start("bash", "-c", f"{stub_binary} 60 & wait")

    def both() -> dict[int, bool]:
        found = python_stubs(server.pid)
        return found if len(found) >= 2 else {}

    found = wait_for(both, 30, 0.01)
    assert found[stub.pid] is True
    assert other.pid not in found and shell.pid not in found
    assert len(found) == 2
    assert python_stubs(other.pid) == {}


@pytest.mark.parametrize("rescan_every", [1, 30])
def test_a_dead_stub_is_reported_once(
    stub_binary: Path, model_stub: tuple[Path, Path], server: FakeTritonserver, rescan_every: int
) -> None:
    first = server.start(*map(str, model_stub))
    second = server.start(str(stub_binary), "60")
    watch = StubWatch(server.pid, rescan_every=rescan_every)
    assert watch.dead() == []

    first.kill()
    wait_zombie(first.pid)  # not reaped yet, as tritonserver leaves it
    assert watch.dead() == [f"postprocessing (pid {first.pid})"]
    assert watch.dead() == []  # reported once

    second.kill()
    second.wait()  # reaped: gone from /proc
    assert watch.dead() == [f"? (pid {second.pid})"]  # no model argument
    assert watch.dead() == []


def test_children_of_a_stub_are_not_stubs(tmp_path: Path, server: FakeTritonserver) -> None:
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
    stub = server.start(str(binary), str(script))
    assert wait_for(child_pid.exists, 30), "the stub did not start its subshell"
    child = int(child_pid.read_text())
    assert state_of(child) != "Z" and comm_of(child) == STUB_COMM

    watch = StubWatch(server.pid, rescan_every=1)
    assert sorted(python_stubs(server.pid)) == [stub.pid]
    assert watch.dead() == []
    os.kill(child, signal.SIGKILL)
    assert wait_for(lambda: gone_or_zombie(child), 30), "the subshell did not die"
    assert watch.dead() == []
    assert python_stubs(server.pid) == {stub.pid: True}


def test_a_stub_that_dies_before_the_first_check_is_named(
    model_stub: tuple[Path, Path], server: FakeTritonserver
) -> None:
    """The watch is made when tritonserver is ready; a stub killed before its first check is
    still named by its model (a zombie's command line is empty)."""
    stub = server.start(*map(str, model_stub))
    assert wait_for(lambda: python_stubs(server.pid).get(stub.pid), 30, 0.01)
    watch = StubWatch(server.pid)
    stub.kill()
    wait_zombie(stub.pid)
    assert watch.dead() == [f"postprocessing (pid {stub.pid})"]


def test_a_stub_dead_before_the_first_look_is_reported(
    stub_binary: Path, server: FakeTritonserver
) -> None:
    stub = server.start(str(stub_binary), "60")
    stub.kill()
    wait_zombie(stub.pid)
    assert StubWatch(server.pid).dead() == [f"? (pid {stub.pid})"]


def test_without_proc_there_is_nothing_to_watch(tmp_path: Path) -> None:
    assert python_stubs(1, tmp_path / "no-proc") == {}
    assert StubWatch(1, tmp_path / "no-proc").dead() == []
