"""Settings and safety checks of workers sharing one tritonserver (the sharing itself runs in
tests/integration/test_workers.py, against a real `bentoml serve`)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from tensorrtllm_backend.serving.deployment import share_triton_ports
from tensorrtllm_backend.settings import PORT_ENVS, SHARED_DIR_ENV, load_settings
from tensorrtllm_backend.triton.command import LOOPBACK, TritonServerConfig, port_free
from tensorrtllm_backend.triton.sharing import SharedTriton, shared_paths


@pytest.mark.parametrize(("value", "expected"), [("", 1), ("1", 1), (" 4 ", 4)])
def test_worker_count(monkeypatch: pytest.MonkeyPatch, value: str, expected: int) -> None:
    monkeypatch.setenv("TRTLLM_WORKERS", value)
    assert load_settings().workers == expected


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_worker_count_rejects_what_is_not_a_count(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TRTLLM_WORKERS", value)
    with pytest.raises(ValueError, match="TRTLLM_WORKERS"):
        load_settings()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment of the test's own: share_triton_ports writes os.environ directly, and what
    it sets must not reach the servers later tests start."""
    names = {*PORT_ENVS, SHARED_DIR_ENV}
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in names})
    return monkeypatch


def test_one_worker_fixes_nothing(clean_env: pytest.MonkeyPatch) -> None:
    share_triton_ports(1)
    assert not any(os.environ.get(name) for name in (*PORT_ENVS, SHARED_DIR_ENV))


def test_shared_ports_are_distinct_and_keep_the_users(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(PORT_ENVS[0], "18001")
    share_triton_ports(2)
    ports = [os.environ[name] for name in PORT_ENVS]
    assert ports[0] == "18001"
    assert len(set(ports)) == 3
    assert Path(os.environ[SHARED_DIR_ENV]).is_dir()
    directory = os.environ[SHARED_DIR_ENV]
    share_triton_ports(2)  # as in a worker, which inherited them: nothing changes
    assert [os.environ[name] for name in PORT_ENVS] == ports
    assert os.environ[SHARED_DIR_ENV] == directory
    os.rmdir(directory)


def test_sharing_needs_fixed_ports(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TRTLLM_TRITON_HTTP_PORT"):
        SharedTriton(TritonServerConfig(tmp_path, grpc_port=18001), tmp_path)


def test_a_follower_kills_only_a_tritonserver(tmp_path: Path) -> None:
    """The stall watchdog of a worker that does not run tritonserver kills the pid its owner
    published, but not if that pid is now some other process."""
    config = TritonServerConfig(tmp_path, grpc_port=18001, http_port=18002, metrics_port=18003)
    follower = SharedTriton(config, tmp_path)
    _lock, pid_file = shared_paths(18001, tmp_path)
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        pid_file.write_text(str(other.pid))
        follower.restart("test")
        with pytest.raises(subprocess.TimeoutExpired):
            other.wait(0.5)
    finally:
        other.kill()
        other.wait()


def test_readiness_of_another_workers_tritonserver_rests_on_the_checks(tmp_path: Path) -> None:
    """A worker cannot see the process of a tritonserver another worker runs: its readiness
    counts only checks and answers (any start time will do) until this worker stops."""
    config = TritonServerConfig(tmp_path, grpc_port=18001, http_port=18002, metrics_port=18003)
    follower = SharedTriton(config, tmp_path)
    assert follower.running_since == 0.0
    follower.stop()
    assert follower.running_since is None


def test_ports_in_time_wait_count_as_free() -> None:
    """A restarted tritonserver listens again on ports whose old connections are in TIME_WAIT
    (it sets SO_REUSEADDR): the check before start must not call them busy."""
    listener = socket.create_server((LOOPBACK, 0))
    port = listener.getsockname()[1]
    client = socket.create_connection((LOOPBACK, port))
    accepted, _ = listener.accept()
    accepted.close()  # the server side closes first: its end goes to TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()
    assert port_free(port)
