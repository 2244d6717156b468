"""Supervise a ``tritonserver`` subprocess: locate it, start it on loopback ports, wait until it is
ready, watch it, restart it when it dies, and stop it without leaving any process behind.

The service owns exactly one :class:`TritonSupervisor`. All process spawning happens on the
supervisor's own thread: tritonserver is exec'd through ``setpriv --pdeathsig KILL``
(`command.with_death_signal`), and the parent-death signal fires when the *thread* that forked
the child exits, so tritonserver dies with the thread that owns it and never outlives a
SIGKILLed service. With several ranks it is mpirun that gets the signal.

Each start draws a new :class:`ControlSecret`: Triton's model-control, shared-memory, log,
trace and statistics APIs answer only requests that carry it (`control`), and it is never
logged.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass, field, replace
from pathlib import Path

from .command import (
    LOOPBACK,
    ControlSecret,
    TritonEndpoints,
    TritonPorts,
    TritonServerConfig,
    build_command,
    choose_ports,
    find_free_port,
    loader_path,
    models_not_ready,
    port_free,
    probe_ready,
    tritonserver_environment,
    with_death_signal,
)
from .install import (
    TritonError,
    TritonInstallation,
    TritonSetupError,
    TritonStartupError,
    default_cache_root,
    find_tritonserver,
)
from .load_failures import log_excerpt, log_tail, raise_if_a_model_failed
from .process_group import terminate_group
from .stub_python import (
    Interpreter,
    StubPython,
    StubPythonError,
    apply_stub_python,
    describe,
    plan_stub_python,
)
from .stub_watch import StubWatch

logger = logging.getLogger(__name__)

LOADING_REPORT_S = 30.0  # how often a slow start says what it waits for
STUB_CHECK_TICKS = 5  # the watch loop ticks every 0.2 s: stubs are checked every second


class ServerState(str, enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"


@dataclass
class _Run:
    process: subprocess.Popen[bytes]
    ports: TritonPorts
    log_path: Path
    control: ControlSecret
    started_at: float = field(default_factory=time.monotonic)


class TritonSupervisor(TritonEndpoints):
    """Owns one tritonserver (or one mpirun) for the lifetime of the service."""

    def __init__(
        self,
        config: TritonServerConfig,
        installation: TritonInstallation | None = None,
        on_state_change: Callable[[ServerState], None] | None = None,
    ) -> None:
        self.config = config
        self._installation = installation
        self._on_state_change = on_state_change
        self._state = ServerState.STOPPED
        self._state_lock = threading.Lock()
        self._ready_event = threading.Event()
        self._start_done = threading.Event()
        self._stop_event = threading.Event()
        self._winding_down = threading.Event()
        self._startup_error: BaseException | None = None
        self._run: _Run | None = None
        self._thread: threading.Thread | None = None
        self._restarts = 0
        self._ports: TritonPorts | None = None
        self._stubs: StubWatch | None = None  # the Python stubs of the current run
        self._check_stubs = config.watch_stubs
        self._stub_python: StubPython | None = None
        self._stub_python_planned = False
        self._failure: str | None = None  # why it is not ready, when it failed
        self._log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="tritonserver-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)

    # -- public API -------------------------------------------------------------------------
    @property
    def state(self) -> ServerState:
        return self._state

    @property
    def restarts(self) -> int:
        return self._restarts

    @property
    def failure(self) -> str | None:
        """Why tritonserver is down (FAILED) or being restarted (RESTARTING); None otherwise."""
        return (
            self._failure if self._state in (ServerState.FAILED, ServerState.RESTARTING) else None
        )

    @property
    def ports(self) -> TritonPorts:
        if self._ports is None:
            raise TritonError("tritonserver has not been started")
        return self._ports

    @property
    def pid(self) -> int | None:
        return self._run.process.pid if self._run else None

    @property
    def control(self) -> ControlSecret | None:
        """The secret the running tritonserver's restricted APIs expect (None while none runs)."""
        return self._run.control if self._run else None

    @property
    def log_path(self) -> Path | None:
        return self._run.log_path if self._run else None

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self._run.log_path, lines) if self._run else ""

    @property
    def running_since(self) -> float | None:
        """When the running tritonserver started (``time.monotonic()``); None while none runs
        (stopped, failed, or dead and not yet replaced). No I/O: /readyz asks it on every call,
        and a dead tritonserver reads as such at once, before the watch loop's next tick."""
        run = self._run
        if run is None or run.process.poll() is not None:
            return None
        return run.started_at

    def is_ready(self) -> bool:
        """Started, found ready by its start-up check, and still running (no I/O)."""
        return self._state is ServerState.READY and self.running_since is not None

    def start(self) -> None:
        """Start tritonserver and block until it is ready (raises TritonStartupError)."""
        if self._thread is not None:
            raise TritonError("supervisor already started")
        self._stop_event.clear()
        self._thread = threading.Thread(target=self._own, name="triton-supervisor", daemon=True)
        self._thread.start()
        self._start_done.wait()
        if self._startup_error is not None:
            error = self._startup_error
            self.stop()
            raise error

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop tritonserver (SIGTERM to its process group, then SIGKILL) and the watcher."""
        self._stop_event.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s + 5)
        if self._run is not None:  # the owner thread normally did this already
            self._terminate(self._run, timeout_s)
        self._set_state(ServerState.STOPPED)

    def wind_down(self) -> None:
        """The service is going down (its worker was told to stop): from now on a tritonserver
        that stops is not restarted. `bentoml serve` sends its stop signal to the worker's
        children too, tritonserver among them, which then unloads its models and exits while the
        worker still drains its requests; without this, the supervisor would take that for a
        crash and start tritonserver again in the middle of the shutdown."""
        self._winding_down.set()

    def restart(self, reason: str) -> None:
        """Kill a tritonserver that is alive but not working; the watch loop starts a new one
        (or reports FAILED when restarts are off)."""
        run = self._run
        if run is None or run.process.poll() is not None or self._winding_down.is_set():
            return
        logger.error("restarting tritonserver: %s", reason)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.process.pid, signal.SIGKILL)

    def wait_ready(self, timeout_s: float) -> bool:
        return self._ready_event.wait(timeout_s)

    def __enter__(self) -> TritonSupervisor:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- owner thread -------------------------------------------------------------------------
    def _own(self) -> None:
        try:
            self._launch_until_ready(ServerState.STARTING)
        except BaseException as error:  # reported to start()'s caller
            self._startup_error = error
            self._failure = str(error)
            self._set_state(ServerState.FAILED)
            self._start_done.set()
            return
        self._start_done.set()
        try:
            self._watch()
        finally:
            if self._run is not None:
                self._terminate(self._run, 10.0)

    def _watch(self) -> None:
        backoff = 1.0
        ticks = 0
        while not self._stop_event.wait(0.2):
            run = self._run
            if run is None:
                continue
            if run.process.poll() is None:
                ticks += 1
                if ticks % STUB_CHECK_TICKS == 0 and self._state is ServerState.READY:
                    self._restart_if_a_stub_died(run)
                continue
            code = run.process.returncode
            if self._winding_down.is_set():
                logger.info("tritonserver stopped (code %s) while the service stops", code)
                self._terminate(run, 2.0)
                self._set_state(ServerState.STOPPED)
                return
            logger.error(
                "tritonserver exited unexpectedly (code %s); last log lines:\n%s",
                code,
                log_tail(run.log_path, 20),
            )
            self._failure = f"tritonserver exited unexpectedly (code {code})"
            self._ready_event.clear()
            self._terminate(run, 2.0)  # reap leftovers of its process group
            if not self.config.restart:
                self._set_state(ServerState.FAILED)
                return
            self._set_state(ServerState.RESTARTING)
            while not self._stop_event.is_set():
                try:
                    self._restarts += 1
                    self._replace_taken_ports()
                    self._launch_until_ready(ServerState.RESTARTING)
                    backoff = 1.0
                    break
                except TritonSetupError as error:
                    # The same models fail the same way at every start: stop here.
                    logger.error("tritonserver cannot be restarted: %s", error)
                    self._failure = str(error)
                    self._set_state(ServerState.FAILED)
                    return
                except TritonError as error:
                    logger.error("restarting tritonserver failed: %s", error)
                    self._failure = f"restarting tritonserver failed: {error}"
                    if self._stop_event.wait(backoff):
                        return
                    backoff = min(backoff * 2, self.config.max_restart_backoff_s)

    def _replace_taken_ports(self) -> None:
        """Before a restart: an HTTP or metrics port that another process took meanwhile (an
        outgoing connection's local port is drawn from the same range) is replaced by a free one,
        unless configured. tritonserver passes its readiness check before it binds the metrics
        port and then exits on a taken one: on the same ports every restart would end so. The
        gRPC port stays, as the clients' address."""
        ports = self._ports
        if ports is None:
            return
        http, metrics = ports.http, ports.metrics
        if not self.config.http_port and not port_free(http):
            http = find_free_port()
        if not self.config.metrics_port and not port_free(metrics):
            metrics = find_free_port()
        if (http, metrics) != (ports.http, ports.metrics):
            logger.warning(
                "tritonserver's port(s) %s were taken by another process: restarting on %s",
                sorted({ports.http, ports.metrics} - {http, metrics}),
                sorted({http, metrics} - {ports.http, ports.metrics}),
            )
            self._ports = replace(ports, http=http, metrics=metrics)

    def _watch_stubs(self, run: _Run) -> None:
        """Note the stubs of a run that just became ready (every model is loaded), so that one
        dying before the first check is still named."""
        if not self._check_stubs:
            return
        try:
            self._stubs = StubWatch(run.process.pid)
        except Exception:  # an unreadable /proc must not fail the start
            logger.exception("reading tritonserver's Python stubs failed; not checking them")
            self._check_stubs = False

    def _restart_if_a_stub_died(self, run: _Run) -> None:
        stubs = self._stubs  # made by _launch_until_ready for each run that became ready
        if not self._check_stubs or stubs is None or stubs.root_pid != run.process.pid:
            return
        if self._winding_down.is_set():
            return  # a stopping tritonserver ends its stubs first
        try:
            dead = stubs.dead()
        except Exception:  # an unreadable /proc must not end the supervision
            logger.exception("checking tritonserver's Python stubs failed; not checking again")
            self._check_stubs = False
            return
        if dead:
            self.restart(
                f"the Python backend stub of {', '.join(dead)} died, and tritonserver does not "
                "start it again"
            )

    def _launch_until_ready(self, state: ServerState) -> None:
        self._set_state(state)
        pinned = None not in (
            self.config.grpc_port,
            self.config.http_port,
            self.config.metrics_port,
        )
        attempts = 1 if pinned else 3
        if pinned and self._ports is None:
            busy = [port for port in astuple(choose_ports(self.config)) if not port_free(port)]
            if busy:  # fail now, not after Triton has spent its start-up loading models
                raise TritonStartupError(
                    f"loopback port(s) {busy} already in use: free them or change "
                    "TRTLLM_TRITON_GRPC_PORT / TRTLLM_TRITON_HTTP_PORT / TRTLLM_TRITON_METRICS_PORT"
                )
        last_error: TritonStartupError | None = None
        for attempt in range(attempts):
            # Keep the ports across restarts so clients reconnect to the same address.
            if attempt or self._ports is None:
                self._ports = choose_ports(self.config)
            run = self._spawn(self._ports)
            try:
                self._wait_until_ready(run)
            except TritonStartupError as error:
                self._terminate(run, 5.0)
                last_error = error
                if "already in use" in str(error) or "Address in use" in str(error):
                    continue  # lost a port race: pick new free ports
                raise
            self._failure = None
            self._watch_stubs(run)
            self._set_state(ServerState.READY)
            self._ready_event.set()
            return
        assert last_error is not None
        raise last_error

    def _environment(self, installation: TritonInstallation) -> dict[str, str]:
        plan = self._plan_stub_python(installation)
        env = tritonserver_environment(installation, self.config.python_paths, plan)
        if plan is not None:
            apply_stub_python(plan, env, default_cache_root())
        return env

    def _plan_stub_python(self, installation: TritonInstallation) -> StubPython | None:
        """Once per supervisor: the libpython / stdlib pair of the python backend stub."""
        if self._stub_python_planned:
            return self._stub_python
        stub = installation.python_stub
        if stub.is_file():  # else no python backend here: nothing to pair
            try:
                self._stub_python = plan_stub_python(
                    stub, Interpreter.current(), loader_path(installation).split(os.pathsep)
                )
            except StubPythonError as error:
                raise TritonSetupError(str(error)) from None
            if self._stub_python is not None:
                logger.info("python models run on %s", describe(self._stub_python))
        self._stub_python_planned = True
        return self._stub_python

    def _spawn(self, ports: TritonPorts) -> _Run:
        if self._installation is None:
            self._installation = find_tritonserver()
        installation = self._installation
        repository = Path(self.config.model_repository)
        if not repository.is_dir():
            raise TritonStartupError(f"model repository {repository} is not a directory")
        control = ControlSecret()
        command = build_command(installation, self.config, ports, control)
        log_path = self._log_dir / f"tritonserver-{int(time.time() * 1000)}.log"
        logger.info("starting tritonserver: %s", control.redact(command))
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                with_death_signal(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._environment(installation),
                start_new_session=True,
            )
        run = _Run(process, ports, log_path, control)
        self._run = run
        return run

    def _wait_until_ready(self, run: _Run) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        polls = 0
        next_report = time.monotonic() + LOADING_REPORT_S
        while time.monotonic() < deadline:
            if self._stop_event.is_set():
                raise TritonStartupError("stopped while tritonserver was starting")
            code = run.process.poll()
            if code is not None:
                raise_if_a_model_failed(run.process, run.log_path)
                raise TritonStartupError(
                    f"tritonserver exited with code {code} before it was ready. "
                    f"{log_excerpt(run.log_path)}"
                )
            polls += 1
            if polls % 5 == 0:  # a failed model may leave tritonserver up (explicit loading)
                raise_if_a_model_failed(run.process, run.log_path)
            if probe_ready(run.ports, timeout=1.0):
                logger.info(
                    "tritonserver ready in %.1f s (grpc %s:%d)",
                    time.monotonic() - run.started_at,
                    LOOPBACK,
                    run.ports.grpc,
                )
                return
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + LOADING_REPORT_S
                self._report_loading(run)
            time.sleep(0.2)
        raise TritonStartupError(
            f"tritonserver was not ready after {self.config.startup_timeout_s:.0f} s. "
            f"{log_excerpt(run.log_path)}"
        )

    def _report_loading(self, run: _Run) -> None:
        """A start that takes long says what it waits for: a model still loading (a large
        engine), one stuck, or a server that does not answer at all."""
        waiting = models_not_ready(run.ports, 2.0, run.control.http_headers)
        logger.warning(
            "tritonserver (pid %d) not ready after %.0f s: %s",
            run.process.pid,
            time.monotonic() - run.started_at,
            "its HTTP endpoint does not answer"
            if waiting is None
            else f"waiting for {', '.join(waiting)}"
            if waiting
            else "every model is READY, the server is not yet",
        )

    def _terminate(self, run: _Run, timeout_s: float) -> None:
        """SIGTERM the process group, SIGKILL it after a grace period; always reap."""
        terminate_group(run.process, timeout_s)
        if self._run is run:
            self._run = None

    def _set_state(self, state: ServerState) -> None:
        with self._state_lock:
            changed = state is not self._state
            self._state = state
        if state is not ServerState.READY:
            self._ready_event.clear()
        if changed and self._on_state_change is not None:
            try:
                self._on_state_change(state)
            except Exception:  # a listener must not break supervision
                logger.exception("state-change listener failed")
