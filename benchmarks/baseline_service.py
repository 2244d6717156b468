"""The straightforward proxy the streaming goals compare against: what one writes first.

Per request it opens a new tritonclient.grpc.aio client, calls the `ensemble` model with
stream=True and yields each response's text as one chunk. No shared channel, no tokenization in
the service, no tuning. Run by stream_bench.py:

    BASELINE_TRITON_GRPC_URL=127.0.0.1:8001 bentoml serve baseline_service:Baseline
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, AsyncIterator

import bentoml
import numpy as np
import tritonclient.grpc.aio as grpcclient

TRITON_URL = os.environ.get("BASELINE_TRITON_GRPC_URL", "127.0.0.1:8001")


def _input(name: str, array: np.ndarray, dtype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), dtype)
    tensor.set_data_from_numpy(array)
    return tensor


@bentoml.service(name="baseline", workers=1, traffic={"timeout": 600})
class Baseline:
    @bentoml.api
    async def generate(self, prompt: str, max_tokens: int = 100) -> AsyncGenerator[str, None]:
        """Stream the ensemble's text; end_id -1 so every request yields max_tokens tokens."""
        inputs = [
            _input("text_input", np.array([[prompt.encode()]], dtype=np.object_), "BYTES"),
            _input("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
            _input("stream", np.array([[True]], dtype=np.bool_), "BOOL"),
            _input("end_id", np.array([[-1]], dtype=np.int32), "INT32"),
        ]

        async def one_request() -> AsyncIterator[dict[str, object]]:
            yield {
                "model_name": "ensemble",
                "inputs": inputs,
                "outputs": [grpcclient.InferRequestedOutput("text_output")],
            }

        client = grpcclient.InferenceServerClient(TRITON_URL)
        try:
            async for result, error in client.stream_infer(one_request()):
                if error is not None:
                    raise RuntimeError(str(error))
                output = result.as_numpy("text_output")
                if output is not None and output.size:
                    yield output.reshape(-1)[0].decode("utf-8", "replace")
        finally:
            await client.close()
