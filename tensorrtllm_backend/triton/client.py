"""One long-lived async gRPC client to the local tritonserver.

Every generation is a streaming call (``ModelStreamInfer``) over one shared channel, also for
non-streaming APIs, so there is a single request path. Leaving the iteration early cancels the
gRPC call, which Triton turns into a cancelled request. A stream that is about to end on its own
(cut at a stop string the engine also got, or a few tokens short of max_tokens) is better handed
to :meth:`TritonLLMClient.let_finish`: a cancellation that races with the request's own end
crashes tritonserver before r24.12 (server#7840), and the end costs the engine nothing more.

A generation's call carries exactly one request, so it is made as a unary-stream call of that
method. On the wire it is what tritonclient's ``stream_infer`` sends (metadata, one request,
half-close), but gRPC sends all three in one batch as the call starts, where ``stream_infer`` (a
bidirectional call fed by a request iterator) takes three event-loop turns and a thread hop
before the request leaves. Under load every turn waits behind the other streams' tokens
(docs/streaming-path.md, "The Triton call: one unary-stream RPC"). Requests are built with
tritonclient's own ``InferInput``; responses are read as :class:`~.responses.GrpcResult`.

Why gRPC and not Triton's HTTP ``generate_stream``, which costs a Python client about half the
CPU per streamed response: tritonserver's HTTP frontend hands each response to its HTTP thread
with a deferred callback that is dropped when that thread falls behind, and under load streams
then lose tokens, start without a status line or never end (docs/streaming-path.md, "Receiving a
token").
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import grpc
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, service_pb2
from tritonclient.grpc._utils import _get_inference_request
from tritonclient.utils import np_to_triton_dtype

from ..common.engine_api import (
    DRAIN_RESPONSES,
    DRAIN_TIMEOUT_S,
    EngineError,
    EngineInstanceDeadError,
    EngineModelError,
    EngineRequestError,
    EngineResult,
    EngineTimeoutError,
    EngineUnavailableError,
    Tensors,
)
from .responses import GrpcResult

logger = logging.getLogger(__name__)

# gRPC statuses of a call, by what a retry of the request would do. Triton down, restarting or
# its queue full: a retry can succeed (503 + Retry-After).
_RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
# The request as sent is refused: the same request fails again (400).
_INVALID_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE})
# Any other status (CANCELLED by the server, UNKNOWN, INTERNAL, ...) is the model server failing
# this request (502), and DEADLINE_EXCEEDED a timeout (504): neither says a retry would succeed.


# The Python backend's error for a request to an instance whose stub is gone; inside an ensemble
# it comes wrapped ("in ensemble 'ensemble', Stub process ...").
_DEAD_STUB = re.compile(r"Stub process '([^']+)' is not healthy")


# Errors Triton answers within a stream (where gRPC carries the message but not the status)
# when it cannot take the request now: its queue is full (max_queue_size), or it is stopping.
_BUSY = re.compile(r"Exceeds maximum queue size|is shutting down|is not ready", re.IGNORECASE)


def dead_instance(message: str) -> str | None:
    """The model instance a Triton error message reports as dead, if it is one of those."""
    match = _DEAD_STUB.search(message)
    return match.group(1) if match else None


# tritonclient's defaults (no message size limit) plus a short reconnect backoff: when the
# supervisor restarts tritonserver on the same port, the channel must find it within a second,
# not after gRPC's default backoff of up to two minutes.
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 2**31 - 1),
]


STREAM_INFER_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"


def inference_request(
    model_name: str, tensors: Tensors, outputs: Sequence[str], request_id: str = ""
) -> service_pb2.ModelInferRequest:
    """The ModelInferRequest tritonclient's stream_infer would build for these tensors (with the
    builder it uses, private to tritonclient, whose version requirements.txt pins)."""
    return _get_inference_request(
        model_name=model_name,
        inputs=make_inputs(tensors),
        model_version="",
        request_id=request_id,
        outputs=[grpcclient.InferRequestedOutput(name) for name in outputs],
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )


def make_inputs(tensors: Tensors) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in tensors.items():
        infer_input = grpcclient.InferInput(
            name, list(array.shape), np_to_triton_dtype(array.dtype)
        )
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    return inputs


async def _drain(
    responses: AsyncGenerator[Any, None], max_responses: int, timeout_s: float
) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            received = 0
            async for _ in responses:
                received += 1
                if received > max_responses:
                    break
    except Exception as error:  # TimeoutError, EngineError, ...
        # Nobody waits for this stream's answer any more.
        logger.debug("a stream left to finish ended with %s: %s", type(error).__name__, error)
    finally:
        await responses.aclose()  # cancels the request if it is still running


class TritonLLMClient:
    """Async streaming inference against one tritonserver, shared by all requests: the
    :class:`~..common.engine_api.InferenceEngine` of the service, over gRPC."""

    def __init__(self, url: str, on_dead_instance: Callable[[str], None] | None = None) -> None:
        self.url = url
        # Told the instance's name when a response says a model instance is dead.
        self.on_dead_instance = on_dead_instance
        self._channel = grpc.aio.insecure_channel(url, options=CHANNEL_ARGS)
        self._stream_infer = self._channel.unary_stream(
            STREAM_INFER_METHOD,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        self._finishing: set[asyncio.Task[None]] = set()
        # Progress, for the stall watchdog: streams open and responses received so far.
        self.open_streams = 0
        self.responses_received = 0
        # When the last response without an error arrived (time.monotonic()), for readiness:
        # a server that just answered serves, however slow its health endpoint is.
        self.last_response_at = 0.0

    @property
    def reconnecting(self) -> bool:
        """Whether the channel waits to reconnect after failing to: a request now fails at once.
        (No I/O; an idle channel connects on the next request.)"""
        state = self._channel.get_state(try_to_connect=False)
        return state is grpc.ChannelConnectivity.TRANSIENT_FAILURE

    async def close(self) -> None:
        for task in list(self._finishing):
            task.cancel()
        await asyncio.gather(*self._finishing, return_exceptions=True)
        await self._channel.close()

    def let_finish(
        self,
        responses: AsyncGenerator[Any, None],
        max_responses: int = DRAIN_RESPONSES,
        timeout_s: float = DRAIN_TIMEOUT_S,
    ) -> None:
        """Read and drop the rest of a stream the caller no longer needs, in the background.

        The stream is cancelled only if it has not ended after `max_responses` more responses or
        `timeout_s`, i.e. when it was not near its end after all.
        """
        task = asyncio.get_running_loop().create_task(_drain(responses, max_responses, timeout_s))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def stream(
        self, model_name: str, tensors: Tensors, outputs: Sequence[str], request_id: str
    ) -> AsyncGenerator[EngineResult, None]:
        """Yield each response of one (decoupled) request; cancel it if the caller stops early."""
        request = inference_request(model_name, tensors, outputs, request_id)
        try:
            call = self._stream_infer(request)
        except grpc.aio.UsageError as error:  # the channel is closed: the service is stopping
            raise EngineUnavailableError(
                f"cannot reach tritonserver at {self.url}: {error}"
            ) from error
        finished = False
        self.open_streams += 1
        try:
            async for response in call:
                self.responses_received += 1
                if response.error_message:
                    raise self._model_error(model_name, response.error_message)
                self.last_response_at = time.monotonic()
                yield GrpcResult(response.infer_response)
            finished = True
        except grpc.aio.AioRpcError as error:
            raise self._status_error(model_name, error) from error
        finally:
            self.open_streams -= 1
            if not finished:
                # Early exit (stop string, disconnect, error): tell Triton to stop generating.
                call.cancel()

    def _status_error(self, model_name: str, error: grpc.aio.AioRpcError) -> EngineError:
        """The error of a call that ended with a gRPC status other than OK."""
        code = error.code()
        details = f"tritonserver stream ended: {code.name} {error.details() or ''}".rstrip()
        if code in _RETRY_CODES:
            return EngineUnavailableError(details)
        if code in _INVALID_CODES:
            return EngineRequestError(f"{model_name} refused the request: {error.details()}")
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return EngineTimeoutError(details)
        if code is grpc.StatusCode.UNKNOWN or code is grpc.StatusCode.INTERNAL:
            return self._model_error(model_name, error.details() or details)
        return EngineModelError(f"{model_name}: {details}")

    def _model_error(self, model_name: str, message: str) -> EngineError:
        instance = dead_instance(message)
        if instance is None:
            if _BUSY.search(message):
                return EngineUnavailableError(f"{model_name}: {message}")
            return EngineModelError(f"{model_name}: {message}")
        if self.on_dead_instance is not None:
            self.on_dead_instance(instance)
        return EngineInstanceDeadError(
            f"the model instance {instance} of tritonserver is dead or not answering; "
            "tritonserver is restarting",
            instance,
        )
