"""Whether the tritonserver behind this worker serves: what /readyz says, answered from state kept
off the request path.

Kubernetes and BentoCloud ask /readyz often and route traffic by its answer. A blocking call to
Triton's readiness endpoint on each of them times out on a busy host while requests succeed, and
the replica would leave the rotation exactly when it carries load. Instead a thread checks
Triton's readiness endpoint about once a second, with a timeout of its own, and every response an
inference gets counts as a check passed. The answer itself does no I/O: it weighs that evidence
against whether a tritonserver process runs (the supervisor's view or, for workers sharing one,
`SharedTriton`'s) and whether the gRPC channel can send a request now.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from .command import TritonPorts, check_ready

logger = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0  # between checks while Triton passes them
RECHECK_INTERVAL_S = 0.2  # between checks while it does not: ready soon after a restart
CHECK_TIMEOUT_S = 5.0  # a late answer on a busy host is no failure; only a stale one counts
STALE_AFTER_S = 10.0  # no check passed and no response for this long: not ready


class ServedTriton(Protocol):
    """What readiness needs of a :class:`TritonSupervisor` or a :class:`SharedTriton`."""

    @property
    def ports(self) -> TritonPorts: ...

    @property
    def running_since(self) -> float | None: ...


class InferenceChannel(Protocol):
    """What readiness needs of the gRPC client (:class:`TritonLLMClient`)."""

    @property
    def last_response_at(self) -> float: ...

    @property
    def reconnecting(self) -> bool: ...


Probe = Callable[[TritonPorts, float], bool | None]


class Readiness:
    """Evidence that tritonserver serves, gathered in the background; :meth:`not_ready_reason`
    answers from it at once.

    Ready means: a tritonserver process runs, the gRPC channel is not waiting to reconnect, and
    since that process started Triton passed a readiness check or answered an inference, more
    recently than it failed a check and less than `stale_after_s` ago. A check that times out
    is neither passed nor failed.
    """

    def __init__(
        self,
        triton: ServedTriton,
        channel: InferenceChannel,
        *,
        interval_s: float = CHECK_INTERVAL_S,
        recheck_interval_s: float = RECHECK_INTERVAL_S,
        timeout_s: float = CHECK_TIMEOUT_S,
        stale_after_s: float = STALE_AFTER_S,
        probe: Probe = check_ready,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._triton = triton
        self._channel = channel
        self.interval_s = interval_s
        self.recheck_interval_s = recheck_interval_s
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self._probe = probe
        self._clock = clock
        # When the last check that Triton passed / failed began (the clock's time; 0: never).
        self._passed_at = 0.0
        self._failed_at = 0.0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="triton-readiness", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(self.timeout_s + 1)

    def check(self) -> bool | None:
        """One check of Triton's readiness endpoint (the background thread's step); None when
        no tritonserver runs or the answer did not come within the timeout."""
        if self._triton.running_since is None:
            return None
        began = self._clock()
        # Time the check by when it began: a process that started after that is not what it saw.
        result = self._probe(self._triton.ports, self.timeout_s)
        if result is True:
            self._passed_at = max(self._passed_at, began)
        elif result is False:
            self._failed_at = max(self._failed_at, began)
        return result

    def not_ready_reason(self) -> str | None:
        """None when tritonserver serves; else why not, in words for /readyz's 503."""
        since = self._triton.running_since
        if since is None:
            return "no tritonserver is running"
        if self._channel.reconnecting:
            return "the gRPC channel to tritonserver is reconnecting"
        served = max(self._passed_at, self._channel.last_response_at)
        if served <= max(since, self._failed_at):
            if self._failed_at > since:
                return "tritonserver does not pass its readiness check"
            return "tritonserver has not passed a readiness check since it started"
        silent_s = self._clock() - served
        if silent_s >= self.stale_after_s:
            return (
                f"tritonserver passed no readiness check and answered no request for "
                f"{silent_s:.0f} s"
            )
        return None

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                passed = self.check()
            except Exception:  # the checks must go on whatever one of them met
                logger.exception("checking tritonserver's readiness failed")
                passed = None
            interval = self.interval_s if passed else self.recheck_interval_s
            self._stopping.wait(interval)
