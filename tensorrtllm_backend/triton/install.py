"""Where tritonserver and its backends are: an explicit path, PATH, NVIDIA's image, or the
nvidia-pytriton wheel (whose python stubs are assembled into the directory layout tritonserver
expects). Also the errors of the Triton process layer."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..settings import load_settings
from .stub_python import STUB_NAME

NGC_TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")
TRITON_DEFAULT_BACKENDS = Path("/opt/tritonserver/backends")  # tritonserver's built-in default
ENV_TRITONSERVER = "TRTLLM_TRITONSERVER"
ENV_BACKEND_DIR = "TRTLLM_TRITON_BACKEND_DIR"


class TritonError(RuntimeError):
    """tritonserver could not be found, started or kept alive."""


class TritonStartupError(TritonError):
    """tritonserver exited or did not become ready; the message carries its log tail."""


class TritonSetupError(TritonStartupError):
    """Starting again would fail the same way (the service's setup is wrong): never retried."""


class TritonModelLoadError(TritonSetupError):
    """A model failed to load for a reason that starting again does not change (an import
    error, a bad config.pbtxt, model.py raising in initialize)."""


@dataclass(frozen=True)
class TritonInstallation:
    """Where tritonserver and the backends it needs live."""

    binary: Path
    backend_dir: Path | None = None
    library_dirs: tuple[Path, ...] = ()

    @property
    def python_stub(self) -> Path:
        """The stub tritonserver starts for each python model instance."""
        return (self.backend_dir or TRITON_DEFAULT_BACKENDS) / "python" / STUB_NAME


def default_cache_root() -> Path:
    """Where the service keeps the small files it derives on this machine (symlink farms)."""
    return Path(tempfile.gettempdir()) / f"bentotrtllm-{os.getuid()}"


def _pytriton_installation(cache_root: Path) -> TritonInstallation | None:
    # Found, not imported: only the files are used, and importing pytriton loads its whole client
    # stack (gevent among others).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    package_dir = Path(next(iter(spec.submodule_search_locations))).resolve() / "tritonserver"
    binary = package_dir / "bin" / "tritonserver"
    stubs = package_dir / "python_backend_stubs"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = stubs / version / STUB_NAME
    python_backend = package_dir / "backends" / "python"
    if not (binary.is_file() and python_backend.is_dir()):
        return None
    if not stub.is_file():
        have = sorted(
            (p.parent.name for p in stubs.glob(f"*/{STUB_NAME}")),
            key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit()),
        )
        raise TritonSetupError(
            f"nvidia-pytriton has Python backend stubs for Python {', '.join(have) or 'none'}, "
            f"not for the Python {version} running this service ({sys.executable}): run the "
            f"service with one of those versions, or set {ENV_TRITONSERVER} and "
            f"{ENV_BACKEND_DIR} to a Triton whose python backend is built for {version}."
        )
    # tritonserver looks for <backend_dir>/python/{libtriton_python.so,stub}: the wheel keeps the
    # stubs apart per Python version, so assemble the directory it expects out of symlinks.
    backend_dir = (
        cache_root / f"pytriton-backends-py{sys.version_info.major}{sys.version_info.minor}"
    )
    target = backend_dir / "python"
    target.mkdir(parents=True, exist_ok=True)
    for source in (
        python_backend / "libtriton_python.so",
        python_backend / "triton_python_backend_utils.py",
        stub,
    ):
        link = target / source.name
        if not (link.is_symlink() and link.resolve() == source.resolve()):
            # Made aside and renamed over: services starting together on one host may race here.
            fresh = target / f".{source.name}.{os.getpid()}"
            fresh.unlink(missing_ok=True)
            fresh.symlink_to(source)
            os.replace(fresh, link)
    libs = package_dir.parent.parent / "nvidia_pytriton.libs"
    return TritonInstallation(binary, backend_dir, (libs,) if libs.is_dir() else ())


def find_tritonserver(cache_root: Path | None = None) -> TritonInstallation:
    """Locate tritonserver: $TRTLLM_TRITONSERVER, PATH, NGC's /opt/tritonserver, nvidia-pytriton."""
    env = load_settings()
    backend_dir = env.triton_backend_dir
    override = env.tritonserver
    if override:
        binary = Path(override)
        if not os.access(binary, os.X_OK):
            raise TritonError(f"{ENV_TRITONSERVER}={override} is not an executable file")
        return TritonInstallation(binary, backend_dir)
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstallation(Path(on_path), backend_dir)
    if os.access(NGC_TRITONSERVER, os.X_OK):
        return TritonInstallation(NGC_TRITONSERVER, backend_dir)
    cache = cache_root or default_cache_root()
    installation = _pytriton_installation(cache)
    if installation is not None:
        return installation
    raise TritonError(
        "tritonserver not found: set TRTLLM_TRITONSERVER, use an NVIDIA Triton image "
        "(/opt/tritonserver/bin/tritonserver), or `pip install nvidia-pytriton==0.7.0` for CPU."
    )
