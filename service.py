"""BentoML service: TensorRT-LLM engines served by a supervised tritonserver on loopback.

    TRTLLM_MODEL=trtllm-demo:latest bentoml serve service:TRTLLM

Configuration (environment): TRTLLM_MODEL (model-store tag), TRTLLM_ROUTE (direct | ensemble |
bls), TRTLLM_TRITON_GRPC_PORT / TRTLLM_TRITON_HTTP_PORT / TRTLLM_TRITON_METRICS_PORT (loopback
ports; free ones by default), TRTLLM_STARTUP_TIMEOUT_S.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import bentoml
from starlette.responses import JSONResponse

from tensorrtllm_backend.errors import as_api_error, error_response
from tensorrtllm_backend.generation import PreparedRequest, RequestError
from tensorrtllm_backend.runtime import LLMRuntime, RuntimeSettings
from tensorrtllm_backend.schemas import GenerateRequest, GenerateResponse, SamplingParams

logger = logging.getLogger("bentoml.trtllm")

MODEL_TAG = os.environ.get("TRTLLM_MODEL", "trtllm-demo:latest")


def _resources(tag: str) -> dict[str, Any]:
    """One GPU per rank for TensorRT-LLM engines; the CPU engine needs none."""
    try:
        metadata = bentoml.models.get(tag).info.metadata
    except bentoml.exceptions.NotFound:
        return {"cpu": "2"}
    if metadata.get("engine_kind") == "cpu":
        return {"cpu": "2"}
    resources: dict[str, Any] = {"gpu": int(metadata.get("engine_world_size", 1))}
    if os.environ.get("TRTLLM_GPU_TYPE"):  # e.g. nvidia-l4, nvidia-a100-80gb (BentoCloud names)
        resources["gpu_type"] = os.environ["TRTLLM_GPU_TYPE"]
    return resources


@bentoml.service(
    name="trtllm",
    workers=1,  # one worker owns the one tritonserver
    resources=_resources(MODEL_TAG),
    traffic={"timeout": 600, "max_concurrency": 1024},
)
class TRTLLM:
    model = bentoml.models.BentoModel(MODEL_TAG)

    def __init__(self) -> None:
        self.runtime = LLMRuntime(Path(self.model.path), RuntimeSettings.from_env())

    @bentoml.on_startup
    async def _start_triton(self) -> None:
        await self.runtime.start()

    @bentoml.on_shutdown
    async def _stop_triton(self) -> None:
        await self.runtime.stop()

    async def __is_ready__(self) -> bool:
        return await self.runtime.is_ready()

    def _prepare(self, fields: dict[str, Any]) -> PreparedRequest:
        request = GenerateRequest(**fields)
        params = SamplingParams(**request.model_dump(exclude={"prompt"}))
        return self.runtime.generator.prepare(request.prompt, params)

    @bentoml.api(input_spec=GenerateRequest)
    async def generate(self, **fields: Any) -> AsyncGenerator[str, None]:
        """Stream the completion of `prompt` as text chunks."""
        try:
            prepared = self._prepare(fields)
        except RequestError as error:
            raise as_api_error(error) from None
        first = True
        try:
            async with aclosing(self.runtime.generator.stream(prepared)) as chunks:
                async for chunk in chunks:
                    if chunk.text:
                        first = False
                        yield chunk.text
        except Exception as error:
            if not first:
                logger.warning("request %s failed mid-stream: %s", prepared.request_id, error)
                raise
            raise as_api_error(error) from None

    @bentoml.api(input_spec=GenerateRequest)
    async def generate_text(self, **fields: Any) -> GenerateResponse:
        """The whole completion of `prompt` at once, with token counts and finish reason."""
        try:
            prepared = self._prepare(fields)
            result = await self.runtime.generator.collect(prepared)
        except Exception as error:
            response: JSONResponse = error_response(error)
            return response  # type: ignore[return-value]
        return result.to_response()
