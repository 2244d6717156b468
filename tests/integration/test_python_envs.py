"""Start-up under any Python environment, and deterministic load failures.

The service is started the ways launchers start it (a bare system PATH; the venv's bin then the
base interpreter's bin, as `pyenv exec` leaves it; the base interpreter's bin first), and each
start must answer /generate with python models whose libpython and standard library come from
one installation. A python model that cannot import its dependencies must end the start within
seconds, with the ImportError in the message, instead of being started again and again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import psutil
import pytest
from test_server import ECHO_CONFIG, ECHO_MODEL, kill_all, process_tree, wait_gone

from tensorrtllm_backend.common.model_store import REPOSITORY
from tensorrtllm_backend.triton.command import TritonServerConfig
from tensorrtllm_backend.triton.install import TritonModelLoadError
from tensorrtllm_backend.triton.supervisor import ServerState, TritonSupervisor
from tests.waiting import wait_for

if TYPE_CHECKING:
    from conftest import BentoServer  # tests/integration/conftest.py

pytestmark = pytest.mark.integration

BASE_BIN = str(Path(sys.base_prefix) / "bin")
VENV_BIN = str(Path(sys.prefix) / "bin")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
HAS_SHARED_LIBPYTHON = any(
    (Path(d) / f"libpython{VERSION}.so.1.0").is_file()
    for d in (sysconfig.get_config_var("LIBDIR") or "", str(Path(sys.base_prefix) / "lib"))
    if d
)

LAYOUTS = {
    "bare-system-path": SYSTEM_PATH,
    "venv-then-base-interpreter": f"{VENV_BIN}:{BASE_BIN}:{SYSTEM_PATH}",
    "base-interpreter-first": f"{BASE_BIN}:{SYSTEM_PATH}",
}


def installation_root(path: str) -> Path | None:
    """The Python installation a mapped file belongs to: the parent of its lib/ directory."""
    parts = Path(path).parts
    if "lib" not in parts:
        return None
    return Path(*parts[: parts.index("lib")])


def stub_python_files(stub: psutil.Process) -> tuple[set[Path], set[Path]]:
    """(installations of the libpython, installations of the stdlib extension modules) that
    the stub has mapped."""
    libraries, stdlib = set(), set()
    for mapping in stub.memory_maps(grouped=True):
        name = Path(mapping.path).name
        if name.startswith("libpython"):
            root = installation_root(str(Path(mapping.path).resolve()))
            if root is not None:
                libraries.add(root)
        elif "/lib-dynload/" in mapping.path:
            root = installation_root(mapping.path)
            if root is not None:
                stdlib.add(root.resolve())
    return libraries, stdlib


@pytest.mark.skipif(
    not HAS_SHARED_LIBPYTHON, reason=f"{sys.base_prefix} has no shared libpython{VERSION}"
)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_service_starts_under_each_path_layout(
    layout: str, synthetic_model: str, bento_launcher: Callable[..., BentoServer]
) -> None:
    env = {"PATH": LAYOUTS[layout], "VIRTUAL_ENV": ""}
    server = bento_launcher(synthetic_model, env, wait=True)
    response = httpx.post(
        f"{server.url}/generate", json={"prompt": "Once upon a time", "max_tokens": 4}, timeout=30
    )
    assert response.status_code == 200, response.text
    assert response.text
    stubs = [p for p in server.tritons() if "triton_python_backend_stub" in p.cmdline()[0]]
    assert stubs, "the synthetic engine runs in a python backend stub"
    for stub in stubs:
        libraries, stdlib = stub_python_files(stub)
        assert len(libraries) == 1 and stdlib, (libraries, stdlib)
        assert stdlib <= libraries, f"libpython of {libraries}, stdlib modules of {stdlib}"


BROKEN_IMPORT = "import package_that_is_not_installed  # noqa: F401\n"


def pack(*args: str) -> str:
    """A model of this module's own in the test store (its files get broken on purpose)."""
    import pack_model

    tag = pack_model.run(pack_model.build_parser().parse_args([*args, "--no-progress"]))
    assert tag is not None
    return tag


def broken_repository(root: Path) -> Path:
    model = root / "echo"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(ECHO_CONFIG)
    (model / "1" / "model.py").write_text(
        ECHO_MODEL.replace("import numpy", BROKEN_IMPORT + "import numpy", 1)
    )
    return root


@pytest.mark.parametrize("explicit", [False, True], ids=["all-models", "explicit-load"])
def test_a_model_that_cannot_import_ends_the_start_with_the_import_error(
    tmp_path: Path, explicit: bool
) -> None:
    startup_timeout_s = 120.0
    supervisor = TritonSupervisor(
        TritonServerConfig(
            model_repository=broken_repository(tmp_path / "repo"),
            startup_timeout_s=startup_timeout_s,
            log_dir=tmp_path / "logs",
            models=("echo",) if explicit else (),
        )
    )
    seen: list[psutil.Process] = []
    started = time.monotonic()
    try:
        with pytest.raises(TritonModelLoadError) as raised:
            supervisor.start()
    finally:
        seen += process_tree(supervisor.pid)
        supervisor.stop()
        kill_all(seen)
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "model 'echo' failed to load" in message
    assert "ModuleNotFoundError: No module named 'package_that_is_not_installed'" in message
    # The load failure ended the start (the error's type and text say so), not the start's
    # deadline, which raises another error: any time well short of that deadline is a pass.
    assert elapsed < startup_timeout_s / 2, f"took {elapsed:.0f} s"
    assert supervisor.restarts == 0 and supervisor.state is ServerState.STOPPED
    assert wait_gone(seen, 5) == []


def test_a_model_broken_after_a_crash_is_not_restarted_forever(tmp_path: Path) -> None:
    """Restarts are for crashes: when the restarted tritonserver cannot load a model, the
    supervisor reports FAILED with the reason instead of trying again."""
    repository = broken_repository(tmp_path / "repo")
    model_py = repository / "echo" / "1" / "model.py"
    broken = model_py.read_text()
    model_py.write_text(broken.replace(BROKEN_IMPORT, ""))
    supervisor = TritonSupervisor(
        TritonServerConfig(
            model_repository=repository, startup_timeout_s=120, log_dir=tmp_path / "logs"
        )
    )
    seen: list[psutil.Process] = []
    try:
        supervisor.start()
        seen += process_tree(supervisor.pid)
        model_py.write_text(broken)
        os.kill(supervisor.pid or 0, signal.SIGKILL)
        assert wait_for(lambda: supervisor.state is ServerState.FAILED, 60), supervisor.state
        assert supervisor.restarts == 1
        assert "package_that_is_not_installed" in (supervisor.failure or "")
        # It stopped there: the thread that would start tritonserver again has ended.
        owner = supervisor._thread
        assert owner is not None
        owner.join(30)
        assert not owner.is_alive(), "the supervisor kept watching a model that cannot load"
        assert supervisor.restarts == 1 and supervisor.pid is None
    finally:
        seen += process_tree(supervisor.pid)
        supervisor.stop()
        kill_all(seen)


def test_service_start_fails_fast_naming_the_import_error(
    bento_launcher: Callable[..., BentoServer],
) -> None:
    """Through `bentoml serve`: a python model that cannot import ends the start quickly."""
    from bentoml.models import get

    tag = pack("--synthetic", "--name", "trtllm-broken-import", "--max-input-len", "64")
    model_py = Path(get(tag).path) / REPOSITORY / "tensorrt_llm" / "1" / "model.py"
    model_py.write_text(BROKEN_IMPORT + model_py.read_text())
    server = bento_launcher(tag)
    # Started again and again, the service would never stop on its own: its stopping at all,
    # with one start in its log, is the behaviour; how fast a loaded host gets there is not.
    try:
        server.process.wait(300)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"`bentoml serve` still runs 300 s after its start failed:\n{server.log()[-3000:]}"
        )
    log = server.log()
    assert "No module named 'package_that_is_not_installed'" in log
    assert "model 'tensorrt_llm' failed to load" in log
    assert "the service cannot start, stopping `bentoml serve`" in log
    assert log.count("Running startup hook") == 1, "the worker was started again"


def test_readyz_says_why_after_a_restart_that_cannot_load(
    bento_launcher: Callable[..., BentoServer],
) -> None:
    """tritonserver crashes, and the model no longer imports: the service stays up, not ready,
    and /readyz's 503 says why instead of BentoML's fixed text."""
    tag = pack("--synthetic", "--name", "trtllm-breaks-later", "--max-input-len", "64")
    server = bento_launcher(tag, wait=True)
    (triton,) = [p for p in server.tritons() if p.name() == "tritonserver"]
    repository = next(
        a.split("=", 1)[1] for a in triton.cmdline() if a.startswith("--model-repository=")
    )
    model_py = Path(repository) / "tensorrt_llm" / "1" / "model.py"
    text = model_py.read_text()
    model_py.unlink()  # a copy of our own: the stored model's file (if linked) stays intact
    model_py.write_text(BROKEN_IMPORT + text)
    triton.kill()

    def said_why() -> httpx.Response | None:
        response = httpx.get(f"{server.url}/readyz", timeout=10)
        return response if "not restarted" in response.text else None

    response = wait_for(said_why, 60, 0.5) or httpx.get(f"{server.url}/readyz", timeout=10)
    assert response.status_code == 503
    assert "the model server failed and is not restarted" in response.text, response.text
    assert "No module named 'package_that_is_not_installed'" in response.text
    assert server.process.poll() is None  # the service itself stays up to say so


def test_a_worker_taking_over_a_model_that_cannot_load_stops_trying(tmp_path: Path) -> None:
    """Workers sharing one tritonserver: when its owner goes away and the model no longer
    loads, the worker taking over reports FAILED once instead of starting Triton every second."""
    from tensorrtllm_backend.triton.command import find_free_port
    from tensorrtllm_backend.triton.sharing import SharedTriton

    repository = broken_repository(tmp_path / "repo")
    model_py = repository / "echo" / "1" / "model.py"
    broken = model_py.read_text()
    model_py.write_text(broken.replace(BROKEN_IMPORT, ""))
    config = TritonServerConfig(
        model_repository=repository,
        grpc_port=find_free_port(),
        http_port=find_free_port(),
        metrics_port=find_free_port(),
        startup_timeout_s=60,
        log_dir=tmp_path / "logs",
    )
    owner = SharedTriton(config, tmp_path, takeover_poll_s=0.2)
    follower = SharedTriton(config, tmp_path, takeover_poll_s=0.2)
    try:
        owner.start()
        follower.start()
        assert owner.owner and not follower.owner
        model_py.write_text(broken)
        owner.stop()
        assert wait_for(lambda: follower.state is ServerState.FAILED, 60), follower.state
        assert "package_that_is_not_installed" in (follower.failure or "")
        assert follower._takeover is not None
        follower._takeover.join(5)
        assert not follower._takeover.is_alive(), "the worker kept trying to take over"
        assert not follower.owner
    finally:
        follower.stop()
        owner.stop()
