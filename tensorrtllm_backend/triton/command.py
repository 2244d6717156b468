"""tritonserver's command line: loopback ports, the configuration of one server, argv (with
mpirun for several ranks) behind its parent-death wrapper, the secret that closes Triton's
control plane, and the environment its python stubs need."""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..settings import BACKEND_PYTHONPATH_ENV, env_name
from .install import TritonInstallation
from .stub_python import StubPython

logger = logging.getLogger(__name__)

API_KEY_ENV = env_name("api_key")
LOOPBACK = "127.0.0.1"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class TritonPorts:
    grpc: int
    http: int
    metrics: int

    @property
    def grpc_url(self) -> str:
        return f"{LOOPBACK}:{self.grpc}"

    @property
    def http_url(self) -> str:
        return f"http://{LOOPBACK}:{self.http}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.metrics}/metrics"


class TritonEndpoints:
    """The URLs of a tritonserver at `ports`: a supervisor's own server or, for a worker that
    shares one, another worker's."""

    ports: TritonPorts

    @property
    def grpc_url(self) -> str:
        return self.ports.grpc_url

    @property
    def http_url(self) -> str:
        return self.ports.http_url

    @property
    def metrics_url(self) -> str:
        return self.ports.metrics_url


@dataclass
class TritonServerConfig:
    model_repository: Path
    grpc_port: int | None = None
    http_port: int | None = None
    metrics_port: int | None = None
    world_size: int = 1
    tensorrt_llm_model_name: str = "tensorrt_llm"
    startup_timeout_s: float = 300.0
    log_verbose: int = 0
    restart: bool = True
    # Restart tritonserver when one of its Python stubs dies (it does not start one again). Off
    # only where models are unloaded on purpose: an unload ends the stub in the same way.
    watch_stubs: bool = True
    max_restart_backoff_s: float = 30.0
    exit_timeout_s: int = 3
    extra_args: Sequence[str] = ()
    python_paths: Sequence[str] | None = None
    log_dir: Path | None = None
    # Load only these models (explicit model control); empty: every model in the repository.
    models: Sequence[str] = ()
    # Let python models complete their config (the llmapi model takes max_batch_size and the
    # decoupled policy from its model.yaml there); NVIDIA's launcher turns it off for engines.
    auto_complete_config: bool = False


def choose_ports(config: TritonServerConfig) -> TritonPorts:
    """The ports of a start: the configured ones, free ones for the others."""
    return TritonPorts(
        grpc=config.grpc_port or find_free_port(),
        http=config.http_port or find_free_port(),
        metrics=config.metrics_port or find_free_port(),
    )


def find_free_port() -> int:
    """A currently free loopback TCP port (the OS picks; a race is retried by the caller)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def check_ready(ports: TritonPorts, timeout: float) -> bool | None:
    """Triton's own readiness endpoint (server live and every loaded model ready): True when it
    says ready; False when it says not ready or nothing listens; None when no answer came within
    `timeout`, which on a busy host says nothing either way."""
    url = f"{ports.http_url}/v2/health/ready"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:  # it answered: not ready
        return False
    except urllib.error.URLError as error:
        return None if isinstance(error.reason, TimeoutError) else False
    except TimeoutError:  # connected, but the answer did not come in time
        return None
    except (OSError, ValueError):
        return False


def models_not_ready(
    ports: TritonPorts, timeout: float, headers: dict[str, str] | None = None
) -> list[str] | None:
    """The models of Triton's repository index that are not READY, each as "name (STATE:
    reason)"; None when the index could not be read (nothing listens yet, or a timeout). The
    index is a restricted API: `headers` carry the run's secret (ControlSecret.http_headers)."""
    request = urllib.request.Request(
        f"{ports.http_url}/v2/repository/index", data=b"{}", headers=headers or {}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            index = json.loads(response.read())
    except (OSError, ValueError):  # URLError and HTTPError are OSErrors
        return None
    waiting = []
    for model in index if isinstance(index, list) else []:
        state = model.get("state") or "UNAVAILABLE"
        if state != "READY":
            reason = model.get("reason")
            waiting.append(f"{model.get('name', '?')} ({state}{': ' + reason if reason else ''})")
    return waiting


def probe_ready(ports: TritonPorts, timeout: float) -> bool:
    """Whether Triton says it is ready, answering within `timeout`."""
    return check_ready(ports, timeout) is True


def _site_packages() -> list[str]:
    import site

    paths = [p for p in site.getsitepackages() if Path(p).is_dir()]
    user = site.getusersitepackages()
    if isinstance(user, str) and Path(user).is_dir():
        paths.append(user)
    return paths


def _installation_site_packages() -> set[str]:
    """The site-packages of this interpreter's base installation (not of a venv on it)."""
    import site

    return {str(Path(p).resolve()) for p in site.getsitepackages([sys.base_prefix])}


def port_free(port: int) -> bool:
    """Whether tritonserver could listen on `port`. It sets SO_REUSEADDR, as here: connections
    of a previous tritonserver left in TIME_WAIT do not keep it from listening again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def default_python_paths(stub: StubPython | None = None) -> list[str]:
    """What a python-backend model puts on sys.path ahead of its own (TRTLLM_BACKEND_PYTHONPATH):
    our package, and the packages of this interpreter that the stub's Python does not have.

    `stub` is the Python the stubs run (None: not known, everything is passed):
    - another Python version: our package alone. Packages installed for this interpreter
      (compiled extensions) cannot load there, and would shadow the stub's own; it imports its
      installation's packages.
    - this interpreter's own installation (NVIDIA's image, where service and stubs run the
      image's Python): that installation's site-packages are already on the stub's path, after
      its standard library; only a virtualenv's and the user's go first.
    - another installation of this version (a venv on pyenv's 3.11 with Debian's 3.11 stub):
      this interpreter's site-packages, venv and base installation.
    """
    ours = str(PROJECT_ROOT)
    if stub is None:
        return [*_site_packages(), ours]
    if stub.version != sys.version_info[:2]:
        return [ours]
    paths = _site_packages()
    if stub.home.resolve() == Path(sys.base_prefix).resolve():
        own = _installation_site_packages()
        paths = [p for p in paths if str(Path(p).resolve()) not in own]
    return [*paths, ours]


# Triton's APIs that change the server: model load / unload / index, shared-memory registration,
# log and trace settings. Health, metadata, model config, statistics (read-only counters, as on
# the metrics port) and inference stay open: the service, its readiness check and monitoring use
# them.
RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")
CONTROL_HEADER = "trtllm-triton-control"
# tritonserver prefixes the header a restricted gRPC protocol expects with this.
GRPC_RESTRICTED_PREFIX = "triton-grpc-protocol-"


@dataclass(frozen=True)
class ControlSecret:
    """The secret one tritonserver run expects on its restricted APIs.

    Triton binds loopback only, but any process of the host's network namespace (a sidecar in
    the pod) could otherwise unload the model. A new secret is drawn for each start; it lives in
    the supervisor's memory and in tritonserver's argv (nowhere in an environment, so no stub
    inherits it), and `repr` hides it so a log line cannot show it.
    """

    value: str = field(repr=False, default_factory=lambda: secrets.token_urlsafe(32))

    def args(self) -> list[str]:
        apis = ",".join(RESTRICTED_APIS)
        return [
            f"--grpc-restricted-protocol={apis}:{CONTROL_HEADER}={self.value}",
            f"--http-restricted-api={apis}:{CONTROL_HEADER}={self.value}",
        ]

    @property
    def http_headers(self) -> dict[str, str]:
        return {CONTROL_HEADER: self.value}

    @property
    def grpc_headers(self) -> dict[str, str]:
        return {GRPC_RESTRICTED_PREFIX + CONTROL_HEADER: self.value}

    def redact(self, command: Sequence[str]) -> str:
        """`command` as a log line, the secret replaced."""
        return " ".join(command).replace(self.value, "<secret>")


def _model_control_args(models: Sequence[str]) -> list[str]:
    if not models:
        return []
    return ["--model-control-mode=explicit", *(f"--load-model={name}" for name in models)]


def build_command(
    installation: TritonInstallation,
    config: TritonServerConfig,
    ports: TritonPorts,
    control: ControlSecret | None = None,
) -> list[str]:
    """argv for tritonserver, or for mpirun with one tritonserver per rank when world_size > 1.

    As NVIDIA's launcher does, each rank gets its own python-backend shared-memory prefix and
    only rank 0 serves clients; the other ranks load just the TensorRT-LLM model. With
    `control`, rank 0's restricted APIs expect its secret.
    """

    def rank_args(rank: int) -> list[str]:
        args = [
            str(installation.binary),
            f"--model-repository={config.model_repository}",
            *(() if config.auto_complete_config else ("--disable-auto-complete-config",)),
            f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
            f"--exit-timeout-secs={config.exit_timeout_s}",
        ]
        if installation.backend_dir is not None:
            args.append(f"--backend-directory={installation.backend_dir}")
        if rank == 0:
            args += [
                f"--grpc-address={LOOPBACK}",
                f"--grpc-port={ports.grpc}",
                f"--http-address={LOOPBACK}",
                f"--http-port={ports.http}",
                f"--metrics-address={LOOPBACK}",
                f"--metrics-port={ports.metrics}",
                f"--log-verbose={config.log_verbose}",
                *_model_control_args(config.models),
                *(control.args() if control is not None else ()),
                *config.extra_args,
            ]
        else:
            args += [
                *_model_control_args([config.tensorrt_llm_model_name]),
                "--allow-http=false",
                "--allow-grpc=false",
                "--allow-metrics=false",
            ]
        return args

    if config.world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {config.world_size}")
    if config.world_size == 1:
        return rank_args(0)
    command = ["mpirun", "--allow-run-as-root"]
    for rank in range(config.world_size):
        command += ["-n", "1", *rank_args(rank), ":"]
    return command[:-1]


def hide_virtualenv(env: dict[str, str]) -> None:
    """Keep an activated virtualenv's interpreter off tritonserver's PATH.

    A python backend stub embeds its own libpython and, with no PYTHONHOME, locates its standard
    library from the first `python3` on PATH. An activated venv puts its interpreter there, whose
    stdlib may belong to a different patch release (e.g. pyenv 3.11.7 next to Debian's 3.11.2):
    extension modules such as _ssl then fail to load in every python model. The models find the
    venv's packages through TRTLLM_BACKEND_PYTHONPATH instead.
    """
    venv = env.pop("VIRTUAL_ENV", None) or (sys.prefix if sys.prefix != sys.base_prefix else None)
    if not venv:
        return
    venv_bin = os.path.realpath(os.path.join(venv, "bin"))
    entries = env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join(e for e in entries if os.path.realpath(e or ".") != venv_bin)


def loader_path(installation: TritonInstallation) -> str:
    """tritonserver's LD_LIBRARY_PATH: the wheel's libraries ahead of this process's."""
    current = os.environ.get("LD_LIBRARY_PATH", "")
    if not installation.library_dirs:
        return current
    return os.pathsep.join([*(str(d) for d in installation.library_dirs), current]).rstrip(
        os.pathsep
    )


def tritonserver_environment(
    installation: TritonInstallation,
    python_paths: Sequence[str] | None,
    stub: StubPython | None = None,
) -> dict[str, str]:
    """This process's environment for tritonserver: the wheel's libraries on the loader path, the
    paths the python models import from (TRTLLM_BACKEND_PYTHONPATH: `python_paths`, or those
    :func:`default_python_paths` gives for the stubs' Python), the venv off PATH, and without
    the service's API key (every python stub inherits this environment)."""
    env = dict(os.environ)
    env.pop(API_KEY_ENV, None)
    if installation.library_dirs:
        env["LD_LIBRARY_PATH"] = loader_path(installation)
    paths = default_python_paths(stub) if python_paths is None else python_paths
    env[BACKEND_PYTHONPATH_ENV] = os.pathsep.join(paths)
    hide_virtualenv(env)
    return env


def _setpriv_with_pdeathsig() -> str | None:
    """util-linux's setpriv, if it is here and knows --pdeathsig (util-linux >= 2.33: Debian 10,
    Ubuntu 20.04 and the NGC images built on them or later)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    try:
        usage = subprocess.run(
            [setpriv, "--help"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return setpriv if "--pdeathsig" in usage else None


@functools.cache
def _death_signal_wrapper() -> str | None:
    """Found once per process, and said once: whether children follow their spawning thread."""
    setpriv = _setpriv_with_pdeathsig()
    if setpriv is None:
        logger.warning(
            "util-linux setpriv with --pdeathsig was not found: tritonserver will not die with a "
            "SIGKILLed worker (a stopped worker still stops it; install util-linux to close this)"
        )
    return setpriv


def with_death_signal(command: Sequence[str], sig: signal.Signals = signal.SIGKILL) -> list[str]:
    """`command` run through `setpriv --pdeathsig`, so that the child gets `sig` when the thread
    that spawned it ends (the worker's supervisor thread, with the worker itself).

    The parent-death signal is set by setpriv after the fork and kept across its exec, so no
    Python runs between fork and exec (a `preexec_fn` in a multithreaded parent can deadlock
    the child). As setpriv asks for it a moment after Popen returns, the spawning thread must
    not end at once (the supervisor's lives as long as its tritonserver). Where setpriv is
    missing, `command` runs as is.
    """
    setpriv = _death_signal_wrapper()
    if setpriv is None:
        return list(command)
    return [setpriv, f"--pdeathsig={sig.name.removeprefix('SIG')}", "--", *command]
