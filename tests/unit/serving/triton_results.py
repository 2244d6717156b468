"""Responses as tritonserver sends them over each transport, built from numpy outputs: a gRPC
``ModelInferResponse`` (raw little-endian bytes, or length-prefixed for BYTES) and an HTTP
``generate_stream`` event (JSON, where Triton writes one element as a bare value and more as a
flat list, and -inf as ``-Infinity``)."""

from __future__ import annotations

import json

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

from tensorrtllm_backend.common.engine_api import EngineResult
from tensorrtllm_backend.triton.responses import GrpcResult, JsonResult

TRANSPORTS = ("grpc", "http")


def grpc_result(**outputs: np.ndarray) -> GrpcResult:
    message = service_pb2.ModelInferResponse(model_name="tensorrt_llm")
    for name, value in outputs.items():
        message.outputs.add(name=name, datatype=np_to_triton_dtype(value.dtype),
                            shape=list(value.shape))  # fmt: skip
        if value.dtype == np.object_:
            raw = serialize_byte_tensor(value).item()
        else:
            raw = value.astype(value.dtype.newbyteorder("<")).tobytes()
        message.raw_output_contents.append(raw)
    return GrpcResult(message)


def json_result(**outputs: np.ndarray) -> JsonResult:
    event: dict[str, object] = {"model_name": "tensorrt_llm", "model_version": "1"}
    for name, value in outputs.items():
        flat = [v.decode() if isinstance(v, bytes) else v for v in value.reshape(-1).tolist()]
        event[name] = flat[0] if len(flat) == 1 else flat
    return JsonResult(json.loads(json.dumps(event)))


def result(transport: str, **outputs: np.ndarray) -> EngineResult:
    """The response carrying `outputs` as `transport` ("grpc" or "http") delivers it."""
    return grpc_result(**outputs) if transport == "grpc" else json_result(**outputs)
