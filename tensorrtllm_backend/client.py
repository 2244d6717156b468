"""One long-lived async gRPC client to the local tritonserver.

Every generation is a streaming call (``ModelStreamInfer``) over one shared channel, also for
non-streaming APIs, so there is a single request path. Leaving the iteration early (client
disconnect, stop string) cancels the gRPC call, which Triton turns into a cancelled request.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, InferResult
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

logger = logging.getLogger(__name__)

# gRPC status codes that mean "Triton is not there right now", as opposed to "the request failed".
_UNAVAILABLE_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,
}


class TritonClientError(RuntimeError):
    """A request to tritonserver failed."""


class TritonUnavailableError(TritonClientError):
    """tritonserver is down, restarting or unreachable: retry later (HTTP 503)."""


class TritonModelError(TritonClientError):
    """A model in tritonserver answered the request with an error."""


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


def make_inputs(tensors: Mapping[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in tensors.items():
        infer_input = grpcclient.InferInput(
            name, list(array.shape), np_to_triton_dtype(array.dtype)
        )
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    return inputs


class TritonLLMClient:
    """Async streaming inference against one tritonserver, shared by all requests."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client = grpcclient.InferenceServerClient(url, channel_args=CHANNEL_ARGS)

    async def close(self) -> None:
        await self._client.close()

    async def stream(
        self,
        model_name: str,
        tensors: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        request_id: str,
    ) -> AsyncIterator[InferResult]:
        """Yield each response of one (decoupled) request; cancel it if the caller stops early."""
        request = {
            "model_name": model_name,
            "inputs": make_inputs(tensors),
            "outputs": [grpcclient.InferRequestedOutput(name) for name in outputs],
            "request_id": request_id,
        }

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield request

        try:
            responses = self._client.stream_infer(one_request())
        except InferenceServerException as error:
            raise TritonUnavailableError(
                f"cannot reach tritonserver at {self.url}: {error}"
            ) from error
        finished = False
        try:
            async for result, error in responses:
                if error is not None:
                    raise TritonModelError(f"{model_name}: {error.message()}")
                if result is not None:
                    yield result
            finished = True
        except grpc.aio.AioRpcError as error:
            if error.code() in _UNAVAILABLE_CODES:
                raise TritonUnavailableError(
                    f"tritonserver stream ended: {error.code().name} {error.details()}"
                ) from error
            raise TritonModelError(f"{model_name}: {error.details()}") from error
        finally:
            if not finished:
                # Early exit (stop string, disconnect, error): tell Triton to stop generating.
                responses.cancel()
