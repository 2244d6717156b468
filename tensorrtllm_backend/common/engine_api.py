"""What the request path needs from the inference server, and the errors it answers with.

:class:`~tensorrtllm_backend.serving.generation.Generator`, the native API and the OpenAI
adapter see only :class:`InferenceEngine`, the :class:`EngineResult` of each response and these
error types: the gRPC client (:mod:`tensorrtllm_backend.triton.client`) implements the interface
and maps gRPC statuses and Triton's error messages to the errors, so nothing above it depends on
gRPC or on how tritonserver words its failures.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

# How many more responses a stream handed to InferenceEngine.let_finish may take to end on its
# own, and for how long, before it is cancelled after all.
DRAIN_RESPONSES = 4
DRAIN_TIMEOUT_S = 5.0


class EngineError(RuntimeError):
    """A request to the inference server failed."""


class EngineUnavailableError(EngineError):
    """The inference server is down, restarting or unreachable: retry later (HTTP 503)."""


class EngineModelError(EngineError):
    """A model in the inference server answered the request with an error (HTTP 502)."""


class EngineRequestError(EngineError):
    """The inference server refused the request as invalid (gRPC INVALID_ARGUMENT or
    OUT_OF_RANGE): the client's request, as the service passed it on, is what to change
    (HTTP 400)."""


class EngineTimeoutError(EngineError):
    """The inference server did not answer within the call's deadline (HTTP 504)."""


class EngineInstanceDeadError(EngineUnavailableError):
    """A Python model's stub process died (killed, out of memory, crashed) or stopped answering
    Triton's health checks. Triton 2.51 then fails every later request to that model instance
    and never starts a new stub: only a restart of tritonserver brings the model back."""

    def __init__(self, message: str, instance: str) -> None:
        super().__init__(message)
        self.instance = instance


# One request's input tensors by name (a string: numpy is imported for type checking only).
Tensors: TypeAlias = "Mapping[str, np.ndarray]"


class EngineResult(Protocol):
    """One streamed response of a request."""

    def values(self, name: str) -> list[Any] | None:
        """The output `name`'s values, flattened (ints, floats, bools or strings as its
        datatype is); None when the response does not carry it."""
        ...


@runtime_checkable
class InferenceEngine(Protocol):
    """Streaming inference against one inference server, shared by all requests.

    `open_streams` and `responses_received` are progress counters for the stall watchdog.
    """

    open_streams: int
    responses_received: int

    def stream(
        self, model_name: str, tensors: Tensors, outputs: Sequence[str], request_id: str
    ) -> AsyncGenerator[EngineResult, None]:
        """Each response of one (decoupled) request; closing the generator early cancels the
        request. Failures raise :class:`EngineError` subclasses."""
        ...

    def let_finish(
        self, responses: AsyncGenerator[Any, None], max_responses: int = ..., timeout_s: float = ...
    ) -> None:
        """Read and drop the rest of a stream nobody needs, in the background, cancelling it only
        if it does not end on its own within `max_responses` responses (DRAIN_RESPONSES) or
        `timeout_s` (DRAIN_TIMEOUT_S)."""
        ...

    async def close(self) -> None:
        """Stop the streams left to finish and release the connection."""
        ...
