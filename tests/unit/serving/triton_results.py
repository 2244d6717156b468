"""Responses as tritonserver sends them over gRPC, built from numpy outputs: a
``ModelInferResponse`` with each output's raw little-endian bytes (length-prefixed for BYTES)."""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

from tensorrtllm_backend.triton.responses import GrpcResult


def result(**outputs: np.ndarray) -> GrpcResult:
    """The response carrying `outputs`, as the service's client reads it."""
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
