"""How TritonLLMClient classifies Triton's error responses: a dead Python stub is the server's
fault and needs a restart (503, Retry-After), any other model error is the request's (502)."""

from __future__ import annotations

import pytest

from tensorrtllm_backend.common.engine_api import (
    EngineInstanceDeadError,
    EngineModelError,
    EngineUnavailableError,
)
from tensorrtllm_backend.serving.errors import as_api_error
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
        api_error = as_api_error(error)
        assert api_error.status == 503 and "retry shortly" in str(api_error)

        other = client._model_error("ensemble", "in ensemble 'ensemble', bad input")
        assert type(other) is EngineModelError
        assert reported == ["postprocessing_0_0"]  # nothing more to restart for
        assert as_api_error(other).status == 502
    finally:
        await client.close()
