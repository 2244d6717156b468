"""How TritonLLMClient classifies Triton's errors, and what the service answers for each: a dead
Python stub is the server's fault and needs a restart (503, Retry-After), a full or stopping
Triton a retry (503), a request Triton refuses as invalid the client's to change (400), any other
model error the model's (502)."""

from __future__ import annotations

import grpc
import pytest

from tensorrtllm_backend.common.engine_api import (
    EngineInstanceDeadError,
    EngineModelError,
    EngineRequestError,
    EngineTimeoutError,
    EngineUnavailableError,
)
from tensorrtllm_backend.serving.errors import answer_for
from tensorrtllm_backend.triton.client import TritonLLMClient, dead_instance

# Messages as tritonserver 2.51 sent them after `kill -9` of a stub (seen in the service's log).
DIRECT = "Stub process 'tensorrt_llm_bls_0_0' is not healthy."
IN_ENSEMBLE = "in ensemble 'ensemble', Stub process 'postprocessing_0_0' is not healthy."


@pytest.mark.parametrize(
    ("message", "instance"),
    [
        (DIRECT, "tensorrt_llm_bls_0_0"),
        (IN_ENSEMBLE, "postprocessing_0_0"),
        ("Stub process is not healthy.", None),  # the stub's own message names no instance
        ("in ensemble 'ensemble', input_ids: wrong shape", None),
    ],
)
def test_dead_instance_is_read_from_the_message(message: str, instance: str | None) -> None:
    assert dead_instance(message) == instance


async def test_a_dead_instance_is_reported_once_per_response_and_is_a_503() -> None:
    reported: list[str] = []
    client = TritonLLMClient("127.0.0.1:1", on_dead_instance=reported.append)
    try:
        error = client._model_error("ensemble", IN_ENSEMBLE)
        assert isinstance(error, EngineInstanceDeadError)
        assert isinstance(error, EngineUnavailableError)
        assert error.instance == "postprocessing_0_0"
        assert reported == ["postprocessing_0_0"]
        answer = answer_for(error)
        assert answer.status == 503 and answer.retry and "retry shortly" in answer.message

        other = client._model_error("ensemble", "in ensemble 'ensemble', bad input")
        assert type(other) is EngineModelError
        assert reported == ["postprocessing_0_0"]  # nothing more to restart for
        assert answer_for(other).status == 502
    finally:
        await client.close()


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


# A call's gRPC status → the error, and the status the service answers with: a retry can
# succeed only for 503; the client's request is what to change only for 400.
STATUSES = [
    (grpc.StatusCode.UNAVAILABLE, EngineUnavailableError, 503),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, EngineUnavailableError, 503),
    (grpc.StatusCode.INVALID_ARGUMENT, EngineRequestError, 400),
    (grpc.StatusCode.OUT_OF_RANGE, EngineRequestError, 400),
    (grpc.StatusCode.DEADLINE_EXCEEDED, EngineTimeoutError, 504),
    (grpc.StatusCode.CANCELLED, EngineModelError, 502),
    (grpc.StatusCode.UNKNOWN, EngineModelError, 502),
    (grpc.StatusCode.INTERNAL, EngineModelError, 502),
    (grpc.StatusCode.NOT_FOUND, EngineModelError, 502),
]


@pytest.mark.parametrize(("code", "kind", "status"), STATUSES, ids=[c.name for c, _, _ in STATUSES])
async def test_grpc_statuses_map_to_honest_answers(code, kind, status) -> None:
    client = TritonLLMClient("127.0.0.1:1")
    try:
        error = client._status_error("tensorrt_llm", rpc_error(code, "details of it"))
        assert type(error) is kind
        answer = answer_for(error)
        assert answer.status == status and "details of it" in answer.message
        assert answer.retry == (status == 503)
    finally:
        await client.close()


@pytest.mark.parametrize(
    "message",
    [
        "Exceeds maximum queue size",
        "GRPC server is shutting down and has stopped accepting new requests.",
        "Request for unknown model: 'tensorrt_llm' is not ready",
    ],
)
async def test_busy_or_stopping_triton_is_a_503(message: str) -> None:
    client = TritonLLMClient("127.0.0.1:1")
    try:
        error = client._model_error("tensorrt_llm", message)
        assert isinstance(error, EngineUnavailableError)
        assert answer_for(error).status == 503
    finally:
        await client.close()
