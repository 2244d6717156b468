"""One streamed response of tritonserver, read by output name: the
:class:`~..common.engine_api.EngineResult` of the gRPC client.

Values are read straight from the ``ModelInferResponse``'s raw output bytes
(``memoryview.cast``), without tritonclient's ``InferResult`` and ``as_numpy``: this runs once
per token, and numpy arrays cost more than the few values inside. Triton's raw tensors are
little-endian, as is every platform TensorRT-LLM runs on. An output's values come flattened: the
readers in ``serving/`` need no shapes.
"""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import service_pb2

# memoryview.cast formats of Triton's numeric datatypes (BYTES is length-prefixed, read apart).
_FORMATS = {
    "BOOL": "?",
    "INT8": "b",
    "INT16": "h",
    "INT32": "i",
    "INT64": "q",
    "UINT8": "B",
    "UINT16": "H",
    "UINT32": "I",
    "UINT64": "Q",
    "FP16": "e",
    "FP32": "f",
    "FP64": "d",
}


def _bytes_elements(raw: bytes) -> list[str]:
    """A BYTES tensor's elements: each a 4-byte little-endian length, then that many bytes."""
    texts = []
    offset = 0
    while offset + 4 <= len(raw):
        length = int.from_bytes(raw[offset : offset + 4], "little")
        offset += 4
        texts.append(raw[offset : offset + length].decode("utf-8", "replace"))
        offset += length
    return texts


class GrpcResult:
    """A response of the gRPC ``ModelStreamInfer`` call."""

    __slots__ = ("response",)

    def __init__(self, response: service_pb2.ModelInferResponse) -> None:
        self.response = response

    def _raw(self, name: str) -> tuple[bytes, str] | None:
        response = self.response
        for index, output in enumerate(response.outputs):
            if output.name == name:
                return response.raw_output_contents[index], output.datatype
        return None

    def values(self, name: str) -> list[Any] | None:
        found = self._raw(name)
        if found is None:
            return None
        raw, datatype = found
        if datatype == "BYTES":
            return _bytes_elements(raw)
        return memoryview(raw).cast(_FORMATS[datatype]).tolist()
