"""A worker follows its dead parent (serving/parent_watch.py), on real processes: a parent that
starts a child running the watch, then is SIGKILLed (as `bentoml serve` is in
tests/integration/test_workers.py, where the shutdown that follows is checked end to end)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tensorrtllm_backend.serving.parent_watch import request_parent_death_signal

ROOT = Path(__file__).resolve().parents[3]

# The child records each SIGTERM; "hang" mode then keeps running, as a shutdown that hangs.
CHILD = """
import os, signal, sys, time
from tensorrtllm_backend.serving.parent_watch import ParentWatch

mode, marker, parent = sys.argv[1], sys.argv[2], int(sys.argv[3])

def on_term(signum, frame):
    with open(marker, "a") as out:
        out.write("TERM\\n")
    if mode != "hang":
        os._exit(0)

signal.signal(signal.SIGTERM, on_term)
while mode == "late" and os.getppid() == parent:  # gone before the watch begins
    time.sleep(0.01)
if mode == "late":  # before the watch, which ends this orphan at once
    print(os.getpid(), os.getppid(), flush=True)
only_the_signal = mode == "death-signal"
ParentWatch(interval_s=600 if only_the_signal else 0.2, grace_s=1.0).start(
    death_signal=only_the_signal
)
if mode != "late":  # once the watch runs: the test kills the parent when it reads this
    print(os.getpid(), os.getppid(), flush=True)
while True:
    time.sleep(1)
"""

# The parent starts the child from its main thread (as BentoML's arbiter does), telling it its
# pid, and lives for argv[1] seconds.
PARENT = """
import os, subprocess, sys, time
subprocess.Popen([*sys.argv[2:], str(os.getpid())])
time.sleep(int(sys.argv[1]))
"""


def _gone(process: psutil.Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.is_running() or process.status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def _family(tmp_path: Path, mode: str, parent_lives_s: int):
    """(parent, child, the child's parent pid once its watch runs, the file of its SIGTERMs);
    both processes are killed at the end."""
    marker = tmp_path / "signals"
    argv = [sys.executable, "-c", PARENT, str(parent_lives_s)]
    parent = subprocess.Popen(
        [*argv, sys.executable, "-c", CHILD, mode, str(marker)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline().decode().split()
        assert len(line) == 2, f"the child did not start: {line!r}"
        yield parent, psutil.Process(int(line[0])), int(line[1]), marker
    finally:
        with contextlib.suppress(ProcessLookupError):
            parent.kill()
        parent.wait(10)
        for process in psutil.process_iter(["cmdline"]):  # the child, found by its marker
            if str(marker) in (process.info["cmdline"] or ()):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()


@pytest.mark.parametrize(
    ("mode", "within_s"),
    [
        # Bounds far above the expected second or so (a loaded host), far below the 600 s
        # the parent would otherwise live: each mode still proves its own path.
        ("death-signal", 30.0),  # the pid watch ticks every 600 s: only the kernel's signal
        ("watch", 30.0),  # no prctl: the pid watch alone
        ("hang", 30.0),  # SIGTERM ignored: SIGKILL after the 1 s grace
    ],
)
def test_the_child_shuts_down_when_its_parent_is_killed(
    tmp_path: Path, mode: str, within_s: float
) -> None:
    with _family(tmp_path, mode, 600) as (parent, child, watched_parent, marker):
        assert watched_parent == parent.pid
        parent.kill()
        parent.wait(10)
        assert _gone(child, within_s), f"the child outlived its parent by {within_s} s"
        assert marker.read_text() == "TERM\n"  # one SIGTERM, then (hang) SIGKILL


def test_a_parent_dead_before_the_watch_began_counts(tmp_path: Path) -> None:
    """A worker whose `bentoml serve` died while the worker was still starting."""
    with _family(tmp_path, "late", 0) as (_parent, child, watched_parent, marker):
        if watched_parent != 1:
            pytest.skip(f"orphans here go to a subreaper (pid {watched_parent}), not init")
        assert _gone(child, 30.0), "the orphaned child kept running"
        assert marker.read_text() == "TERM\n"


def test_the_death_signal_is_asked_for_only_from_the_main_thread() -> None:
    """The kernel ties it to the calling thread: one that ends early would fire it too soon."""
    results: list[bool] = []
    thread = threading.Thread(target=lambda: results.append(request_parent_death_signal(0)))
    thread.start()
    thread.join()
    assert results == [False]
    # From the main thread it is granted (signal 0 clears it again: pytest's own setting).
    assert request_parent_death_signal(0) is True


STOP_SIGNAL_CHILD = """
import os, signal, sys
from tensorrtllm_backend.serving.parent_watch import on_stop_signal

calls = []
signal.signal(signal.SIGTERM, lambda signum, frame: calls.append("previous"))
on_stop_signal(lambda: calls.append("callback"))
os.kill(os.getpid(), signal.SIGTERM)
print(",".join(calls), flush=True)
"""


def test_a_stop_signal_reaches_the_callback_before_the_previous_handler() -> None:
    """What the service learns the moment its worker is told to stop (uvicorn's handler stays)."""
    out = subprocess.run(
        [sys.executable, "-c", STOP_SIGNAL_CHILD],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "callback,previous"
