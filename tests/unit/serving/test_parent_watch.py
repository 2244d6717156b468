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

mode, marker = sys.argv[1], sys.argv[2]

def on_term(signum, frame):
    with open(marker, "a") as out:
        out.write("TERM\\n")
    if mode != "hang":
        os._exit(0)

signal.signal(signal.SIGTERM, on_term)
only_the_signal = mode == "death-signal"
ParentWatch(interval_s=600 if only_the_signal else 0.2, grace_s=1.0).start(
    death_signal=only_the_signal
)
print(os.getpid(), flush=True)
while True:
    time.sleep(1)
"""

# The parent starts the child from its main thread (as BentoML's arbiter does) and waits.
PARENT = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(600)"


def _gone(process: psutil.Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.is_running() or process.status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("mode", "within_s"),
    [
        ("death-signal", 2.0),  # the pid watch ticks every 600 s: only the kernel's signal
        ("watch", 3.0),  # no prctl: the pid watch alone
        ("hang", 5.0),  # SIGTERM ignored: SIGKILL after the 1 s grace
    ],
)
def test_the_child_shuts_down_when_its_parent_is_killed(
    tmp_path: Path, mode: str, within_s: float
) -> None:
    marker = tmp_path / "signals"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, sys.executable, "-c", CHILD, mode, str(marker)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    child: psutil.Process | None = None
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline().decode().strip()
        assert line.isdigit(), f"the child did not start: {line!r}"
        child = psutil.Process(int(line))
        assert child.ppid() == parent.pid
        parent.kill()
        parent.wait(10)
        assert _gone(child, within_s), f"the child outlived its parent by {within_s} s"
        assert marker.read_text() == "TERM\n"  # one SIGTERM, then (hang) SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError):
            parent.kill()
        parent.wait(10)
        if child is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def test_the_death_signal_is_asked_for_only_from_the_main_thread() -> None:
    """The kernel ties it to the calling thread: one that ends early would fire it too soon."""
    results: list[bool] = []
    thread = threading.Thread(target=lambda: results.append(request_parent_death_signal(0)))
    thread.start()
    thread.join()
    assert results == [False]
    # From the main thread it is granted (signal 0 clears it again: pytest's own setting).
    assert request_parent_death_signal(0) is True
