"""A BentoML worker follows its arbiter: when `bentoml serve` dies, the worker shuts down; and
the worker learns at once when it is told to stop (:func:`on_stop_signal`); and it shows its
threads' stacks when asked (:func:`dump_stacks_on_signal`).

BentoML starts each worker in a session of its own, so a SIGKILL of `bentoml serve`, or of its
process group, does not reach the workers: re-parented to init, each would keep the listening
socket, its tritonserver and its stubs running. So the worker asks for SIGTERM when its parent
dies (``PR_SET_PDEATHSIG``), and a daemon thread also compares the parent pid with the one seen
at start every second (for where prctl is missing). A worker whose arbiter died while it was
still starting is already a child of init when it asks: a parent pid 1 that is not `bentoml
serve` (as it is when a container starts it first) counts as a dead parent. All of these end in
what the arbiter sends to stop a worker: SIGTERM to the worker and to its children (BentoML's
watchers stop children too), so the stop is the same as one by `bentoml serve`. tritonserver
gives the requests in flight its exit timeout and ends them, so a stream in flight ends within
seconds instead of holding the worker until the grace below runs out; uvicorn shuts down, the
service's on_shutdown hook runs, the socket closes. A shutdown still running after `grace_s`
ends in SIGKILL, which tritonserver follows through its own parent-death signal.

Nothing here is on the request path: one syscall at start and one `getppid()` a second.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import psutil

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_INIT_PID = 1
# How long a worker whose arbiter is gone may take to stop (circus' default graceful_timeout;
# BentoML's watchers wait a day, but no arbiter is left to wait here).
ARBITER_GRACE_S = 30.0


def is_bentoml_serve(pid: int) -> bool:
    """Whether process `pid` runs `bentoml serve` (False when it cannot be read)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(b"bentoml" in part for part in command) and b"serve" in command


def request_parent_death_signal(sig: int) -> bool:
    """Ask the kernel for signal `sig` when the parent dies (0: none); False where prctl is not
    available.

    The kernel sends it when the parent *thread* that forked this process exits: BentoML's
    arbiter forks its workers from its main thread, so that is when the arbiter exits. The
    setting belongs to the calling thread, which must be this process's main thread (the one
    that lives as long as the process).
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    return False


def stop_as_the_arbiter_would() -> None:
    """SIGTERM to this process, then to each of its children, as circus stops a worker with
    `stop_children` (BentoML's setting): the worker first, so it winds down before its
    tritonserver exits (see TritonSupervisor.wind_down)."""
    os.kill(os.getpid(), signal.SIGTERM)
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                child.send_signal(signal.SIGTERM)


class ParentWatch:
    """Stop this process and its children once its parent is gone; SIGKILL `grace_s` later if
    still alive."""

    def __init__(self, interval_s: float = 1.0, grace_s: float = ARBITER_GRACE_S) -> None:
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.parent = os.getppid()
        # Init's child already: the arbiter died before this watch began (unless it is init).
        self.orphaned_at_start = self.parent == _INIT_PID and not is_bentoml_serve(_INIT_PID)
        self._thread = threading.Thread(target=self._watch, name="parent-watch", daemon=True)

    def start(self, death_signal: bool = True) -> ParentWatch:
        if death_signal and not request_parent_death_signal(signal.SIGTERM):
            logger.info("no parent-death signal here: watching the parent pid only")
        self._thread.start()
        return self

    def _orphaned(self) -> bool:
        return self.orphaned_at_start or os.getppid() != self.parent

    def _watch(self) -> None:
        while not self._orphaned():
            time.sleep(self.interval_s)
        logger.warning("the parent of this worker (`bentoml serve`) is gone: shutting down")
        stop_as_the_arbiter_would()
        time.sleep(self.grace_s)
        logger.error("shutdown still running after %.0f s: killing this worker", self.grace_s)
        os.kill(os.getpid(), signal.SIGKILL)


_watch: ParentWatch | None = None


def follow_parent() -> ParentWatch:
    """Start this worker's watch, once per process (call it from the main thread)."""
    global _watch
    if _watch is None:
        _watch = ParentWatch().start()
    return _watch


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signal(callback: Callable[[], None]) -> None:
    """Run `callback` first whenever this worker gets SIGTERM or SIGINT, then the handler that
    was there (uvicorn's, which starts the graceful shutdown). Call it from the main thread
    while the server runs; `callback` runs in a signal handler, so it must be quick (set a flag).

    The service's shutdown hooks run only once the server has drained its requests, seconds or
    minutes later; what must change as soon as the stop begins cannot wait for them.
    """
    for sig in STOP_SIGNALS:
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: FrameType | None, previous: object = previous) -> None:
            callback()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:  # nobody handled it: do what it would have done
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, handler)


STACKS_SIGNAL = signal.SIGUSR1


def dump_stacks_on_signal() -> None:
    """SIGUSR1 writes the stack of every thread of this worker to its stderr (the service log):
    what a worker that stopped making progress is waiting on, without stopping it."""
    faulthandler.register(STACKS_SIGNAL, all_threads=True, chain=False)
