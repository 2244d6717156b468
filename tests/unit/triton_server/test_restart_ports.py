"""Before a restart the supervisor replaces an HTTP or metrics port another process took (a
real listening socket here), keeps the gRPC port, and never changes a configured one."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorrtllm_backend.triton.command import (
    LOOPBACK,
    TritonPorts,
    TritonServerConfig,
    find_free_port,
    port_free,
)
from tensorrtllm_backend.triton.supervisor import TritonSupervisor


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def supervisor(tmp_path: Path, ports: TritonPorts, **config: int) -> TritonSupervisor:
    made = TritonSupervisor(
        TritonServerConfig(model_repository=tmp_path, log_dir=tmp_path / "logs", **config)
    )
    made._ports = ports  # as the last run left them
    return made


def test_a_taken_metrics_port_is_replaced_and_the_grpc_port_kept(tmp_path, taken) -> None:
    grpc, http = find_free_port(), find_free_port()
    restarted = supervisor(tmp_path, TritonPorts(grpc=grpc, http=http, metrics=taken))
    restarted._replace_taken_ports()
    ports = restarted.ports
    assert (ports.grpc, ports.http) == (grpc, http)
    assert ports.metrics != taken and port_free(ports.metrics)


def test_free_and_configured_ports_stay(tmp_path, taken) -> None:
    kept = TritonPorts(grpc=find_free_port(), http=find_free_port(), metrics=taken)
    restarted = supervisor(tmp_path, kept, metrics_port=taken)
    restarted._replace_taken_ports()
    assert restarted.ports == kept
