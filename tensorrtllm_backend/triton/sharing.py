"""One tritonserver for all the HTTP workers of a service (TRTLLM_WORKERS > 1).

A single Python process receives at most several thousand streamed gRPC responses a second (each
costs ~100+ µs of its CPU), which a busy GPU exceeds. More workers spread that work over more
cores, but the GPU holds one engine: the workers must share one tritonserver. Its loopback ports
are fixed before the workers start (`deployment.share_triton_ports`), so every worker knows them.

The worker that holds an exclusive lock named after the gRPC port runs tritonserver with a
:class:`TritonSupervisor`, as a single worker does. The others connect to the same ports and keep
trying the lock: when the owner goes away (a crash, or a stopped worker; inside a container
BentoML does not respawn dead workers), tritonserver dies with it and one of them starts a new
one on the same ports, where every worker's gRPC channel reconnects.

No worker calls Triton's restricted APIs (model control and the like, see
`command.ControlSecret`): inference, health and metadata are open to all of them, so the
owner's secret never leaves its supervisor.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

from .command import TritonEndpoints, TritonPorts, TritonServerConfig, probe_ready
from .install import TritonSetupError, TritonStartupError
from .supervisor import ServerState, TritonSupervisor

logger = logging.getLogger(__name__)

TAKEOVER_POLL_S = 1.0


def shared_paths(grpc_port: int, directory: Path | None = None) -> tuple[Path, Path]:
    """The lock and the pid file of the tritonserver on `grpc_port`."""
    base = directory or Path(tempfile.gettempdir())
    stem = base / f"trtllm-tritonserver-{os.getuid()}-{grpc_port}"
    return stem.with_suffix(".lock"), stem.with_suffix(".pid")


def _is_our_tritonserver(pid: int, grpc_port: int) -> bool:
    """Guards the kill of a pid read from a file against a reused pid."""
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (
        any(arg.endswith(b"tritonserver") for arg in arguments)
        and f"--grpc-port={grpc_port}".encode() in arguments
    )


class SharedTriton(TritonEndpoints):
    """The tritonserver of a multi-worker service, as seen from one worker.

    Offers what the runtime uses of a :class:`TritonSupervisor` (start, stop, restart, state,
    running_since, URLs), whether this worker runs tritonserver or uses another's.
    """

    def __init__(
        self,
        config: TritonServerConfig,
        lock_dir: Path | None = None,
        takeover_poll_s: float = TAKEOVER_POLL_S,
    ) -> None:
        grpc_port, http_port, metrics_port = config.grpc_port, config.http_port, config.metrics_port
        if grpc_port is None or http_port is None or metrics_port is None:
            raise ValueError(
                "workers sharing one tritonserver need its ports fixed in advance: set "
                "TRTLLM_TRITON_GRPC_PORT, TRTLLM_TRITON_HTTP_PORT and TRTLLM_TRITON_METRICS_PORT "
                "(service.py sets free ones when `bentoml serve` imports it)"
            )
        self.config = config
        self.ports = TritonPorts(grpc_port, http_port, metrics_port)
        self.lock_path, self.pid_path = shared_paths(self.ports.grpc, lock_dir)
        self.takeover_poll_s = takeover_poll_s
        self.supervisor: TritonSupervisor | None = None  # while this worker runs tritonserver
        self._lock_file: int | None = None
        self._stopping = threading.Event()
        self._winding_down = threading.Event()
        self._guard = threading.Lock()  # takeover vs stop
        self._starting: TritonSupervisor | None = None
        self._takeover: threading.Thread | None = None
        self._failure: str | None = None  # a takeover that cannot succeed

    # -- what the runtime uses ------------------------------------------------------------------
    @property
    def owner(self) -> bool:
        return self.supervisor is not None

    @property
    def state(self) -> ServerState:
        supervisor = self.supervisor
        if supervisor is not None:
            return supervisor.state
        # Another worker's: whether it answers is what the readiness checks find out.
        if self._failure is not None:
            return ServerState.FAILED
        return ServerState.STOPPED if self._stopping.is_set() else ServerState.READY

    @property
    def running_since(self) -> float | None:
        """As :attr:`TritonSupervisor.running_since` for the tritonserver this worker runs. For
        another worker's, its start is not known here: 0.0 unless this worker stopped or cannot
        take over, and the readiness checks tell whether it serves."""
        supervisor = self.supervisor
        if supervisor is not None:
            return supervisor.running_since
        return 0.0 if self.state is ServerState.READY else None

    @property
    def failure(self) -> str | None:
        """Why the tritonserver this worker runs is down or restarting (None for another's)."""
        supervisor = self.supervisor
        return supervisor.failure if supervisor is not None else self._failure

    def start(self) -> None:
        """Run tritonserver or find the worker that does; block until it is ready."""
        deadline = time.monotonic() + self.config.startup_timeout_s
        while not self._stopping.is_set():
            if self._try_own():
                return
            if probe_ready(self.ports, timeout=1.0):
                logger.info("using the tritonserver of another worker (grpc %s)", self.grpc_url)
                self._takeover = threading.Thread(
                    target=self._watch_owner, name="triton-takeover", daemon=True
                )
                self._takeover.start()
                return
            if time.monotonic() > deadline:
                raise TritonStartupError(
                    f"no worker had tritonserver ready on {self.grpc_url} after "
                    f"{self.config.startup_timeout_s:.0f} s (TRTLLM_STARTUP_TIMEOUT_S)"
                )
            time.sleep(0.2)
        raise TritonStartupError("stopped while waiting for tritonserver")

    def wind_down(self) -> None:
        """The service is going down: no restart and no takeover from now on (see
        TritonSupervisor.wind_down)."""
        self._winding_down.set()
        if self.supervisor is not None:
            self.supervisor.wind_down()

    def restart(self, reason: str) -> None:
        """Kill a wedged tritonserver; its owner's supervisor starts a new one."""
        if self._winding_down.is_set():
            return
        if self.supervisor is not None:
            self.supervisor.restart(reason)
            return
        try:
            pid = int(self.pid_path.read_text())
        except (OSError, ValueError):
            return
        if not _is_our_tritonserver(pid, self.ports.grpc):
            return
        logger.error("restarting tritonserver (run by another worker): %s", reason)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def stop(self) -> None:
        self._stopping.set()
        with self._guard:
            starting, self._starting = self._starting, None
            supervisor, self.supervisor = self.supervisor, None
        if starting is not None:
            starting.stop()  # its start() raises in the taking-over thread, which unlocks
        if self._takeover is not None and self._takeover is not threading.current_thread():
            self._takeover.join(self.takeover_poll_s + 15)
            self._takeover = None
        if supervisor is not None:
            supervisor.stop()
            with contextlib.suppress(OSError):
                self.pid_path.unlink()
        self._unlock()

    # -- ownership ------------------------------------------------------------------------------
    def _try_own(self) -> bool:
        """Take the lock and start tritonserver; False if another worker holds the lock."""
        with self._guard:
            if self._stopping.is_set() or not self._lock():
                return False
            supervisor = TritonSupervisor(
                self.config,
                on_state_change=lambda state: self._published(supervisor, state),
            )
            self._starting = supervisor  # stop() may stop it while it starts
        try:
            supervisor.start()
        except BaseException:
            with self._guard:
                self._starting = None
            self._unlock()
            raise
        with self._guard:
            stopped = self._starting is None  # stop() came first and already stopped it
            self._starting = None
            if not stopped:
                self.supervisor = supervisor
        if stopped:
            supervisor.stop()
            self._unlock()
        return not stopped

    def _published(self, supervisor: TritonSupervisor, state: ServerState) -> None:
        """Let the other workers' stall watchdogs find tritonserver's pid (new at each restart)."""
        pid = supervisor.pid
        if state is ServerState.READY and pid is not None:
            partial = self.pid_path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(str(pid))
            partial.replace(self.pid_path)

    def _watch_owner(self) -> None:
        while not self._stopping.wait(self.takeover_poll_s):
            if self._winding_down.is_set():
                return  # the other workers are stopping too: nothing to take over
            try:
                if self._try_own():
                    logger.warning(
                        "the worker running tritonserver went away: this worker (pid %d) took "
                        "over on %s",
                        os.getpid(),
                        self.grpc_url,
                    )
                    return
            except TritonSetupError as error:  # would fail the same way every second
                logger.error("cannot take over tritonserver, not trying again: %s", error)
                self._failure = str(error)
                return
            except Exception as error:  # this thread must go on watching whatever happens
                if self._stopping.is_set():
                    return
                # Typically the old tritonserver still holds the ports for a moment.
                logger.warning("taking over tritonserver failed, retrying: %s", error)

    def _lock(self) -> bool:
        if self._lock_file is not None:
            return True
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return False
        self._lock_file = descriptor
        return True

    def _unlock(self) -> None:
        with self._guard:
            descriptor, self._lock_file = self._lock_file, None
        if descriptor is not None:
            os.close(descriptor)  # releases the flock
