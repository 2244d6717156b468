"""BentoML service: TensorRT-LLM engines served by a supervised tritonserver on loopback.

    TRTLLM_MODEL=trtllm-demo:latest bentoml serve service:TRTLLM

Everything heavy lives in `tensorrtllm_backend`; configuration is by environment variables
(TRTLLM_MODEL, TRTLLM_ROUTE, Triton ports, API key, limits...: see docs/configuration.md).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import bentoml
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from tensorrtllm_backend.serving.api_surface import root_app, v1_routes
from tensorrtllm_backend.serving.apis import NATIVE_LABEL
from tensorrtllm_backend.serving.chat.core import ChatCore
from tensorrtllm_backend.serving.chat.stream import answer_steps, collect
from tensorrtllm_backend.serving.deployment import (
    bento_image,
    end_serving,
    freeze_startup_heap,
    lengthen_keep_alive,
    log_server_errors_once,
    model_tag,
    resources,
    settle_workers,
    share_triton_ports,
    tracing_config,
    traffic,
)
from tensorrtllm_backend.serving.errors import (
    NativeErrorMiddleware,
    StreamAborted,
    as_api_error,
    error_response,
    log_api_errors_briefly,
)
from tensorrtllm_backend.serving.generation import PreparedRequest
from tensorrtllm_backend.serving.guard import GuardMiddleware
from tensorrtllm_backend.serving.metrics_export import build_triton_metrics_app
from tensorrtllm_backend.serving.native_api.render import native_response
from tensorrtllm_backend.serving.openai_api.routes import build_openai_app
from tensorrtllm_backend.serving.openapi_docs import OpenAPIDocsMiddleware
from tensorrtllm_backend.serving.parent_watch import (
    dump_stacks_on_signal,
    follow_parent,
    on_stop_signal,
)
from tensorrtllm_backend.serving.request_errors import RequestError
from tensorrtllm_backend.serving.request_timeout import run_request_timeout_inline
from tensorrtllm_backend.serving.responses_api.sealing import share_reasoning_key
from tensorrtllm_backend.serving.runtime import LLMRuntime
from tensorrtllm_backend.serving.schemas import (
    GenerateRequest,
    GenerateResponse,
    PlainTextStream,
    SamplingParams,
)
from tensorrtllm_backend.serving.streaming import coalesce, join_text
from tensorrtllm_backend.settings import load_settings
from tensorrtllm_backend.triton.install import TritonSetupError

logger = logging.getLogger("bentoml.trtllm")

MODEL_TAG = model_tag()
WORKERS = settle_workers()  # TRTLLM_WORKERS, or a worker per 4 cores (1 to 8)
share_triton_ports(WORKERS)  # in `bentoml serve`'s own process, before it starts the workers
share_reasoning_key()  # likewise: one key for every worker
lengthen_keep_alive()  # before BentoML's worker builds its uvicorn.Config
log_server_errors_once()
run_request_timeout_inline()  # before BentoML's worker builds its app
log_api_errors_briefly()


def _current_service() -> TRTLLM | None:
    """The running service instance (the mounted ASGI apps are created before it exists)."""
    try:
        return bentoml.get_current_service()  # type: ignore[no-any-return]
    except bentoml.exceptions.BentoMLException:
        return None


def _current_chat() -> ChatCore | None:
    service = _current_service()
    return service.chat if service is not None else None


openai_app = build_openai_app(_current_chat, v1_routes)


@bentoml.asgi_app(openai_app, path="/v1")
@bentoml.service(
    name="trtllm",
    workers=WORKERS,  # they share one tritonserver
    resources=resources(MODEL_TAG),
    traffic=traffic(MODEL_TAG),  # timeout, concurrency (TRTLLM_CONCURRENCY)
    tracing=tracing_config(),
    image=bento_image(),  # + bentofile.yaml: the base image's own Python and packages
)
class TRTLLM:
    model = bentoml.models.BentoModel(MODEL_TAG)

    def __init__(self) -> None:
        try:
            self.runtime = LLMRuntime(Path(self.model.path), load_settings())
        except ValueError as error:  # a model or setting this service cannot serve
            end_serving(error)
            raise
        self.chat: ChatCore | None = None  # set once Triton is up

    @bentoml.on_startup
    async def _start_triton(self) -> None:
        follow_parent()  # a worker outlives a killed `bentoml serve` otherwise
        on_stop_signal(self.runtime.wind_down)
        dump_stacks_on_signal()
        try:
            await self.runtime.start()
        except TritonSetupError as error:
            end_serving(error)  # else BentoML starts this worker again, and again
            raise
        freeze_startup_heap()
        self.chat = ChatCore(
            self.runtime.generator,
            self.runtime.served_model_name,
            self.runtime.settings.stream_interval,
            self.runtime.settings.tool_parser,
            self.runtime.settings.reasoning_parser,
            self.runtime.quantization,
            self.runtime.vision,
            self.runtime.images_unsupported or "",
        )

    @bentoml.on_shutdown
    async def _stop_triton(self) -> None:
        self.chat = None
        await self.runtime.stop()

    async def __is_ready__(self) -> bool:
        reason = self.runtime.not_ready_reason()  # from state: no I/O on the probe's path
        if reason is None:
            return True
        # BentoML answers False with a fixed text; this 503 says why (failed, restarting...).
        raise HTTPException(503, detail=reason)

    async def _admit(self, fields: dict[str, Any]) -> PreparedRequest:
        request = GenerateRequest(**fields)
        params = SamplingParams(**request.model_dump(exclude={"prompt", "lora", "images"}))
        if not request.images:
            return await self.runtime.generator.admit(
                request.prompt, params, api=NATIVE_LABEL, lora=request.lora
            )
        if self.chat is None:
            raise RequestError("the model is still loading: retry shortly", 503)
        ids, images = await self.chat.prompt_images(request.prompt, request.images)
        return await self.runtime.generator.admit(
            request.prompt, params, api=NATIVE_LABEL, lora=request.lora, token_ids=ids.expanded,
            written_ids=ids.written, images=images,
        )  # fmt: skip

    @bentoml.api(input_spec=GenerateRequest, output_spec=PlainTextStream)
    async def generate(self, **fields: Any) -> AsyncGenerator[str, None]:
        """Stream the completion of `prompt` as text chunks."""
        try:
            prepared = await self._admit(fields)
            if prepared.params.num_return_sequences > 1:
                raise RequestError(
                    "generate streams one sequence as plain text: ask for several with "
                    "generate_text, or with n on /v1/completions or /v1/chat/completions",
                    param="num_return_sequences",
                )
        except Exception as error:
            raise as_api_error(error, "/generate") from None
        first = True
        try:
            interval = self.runtime.settings.stream_interval
            texts = coalesce(self._texts(prepared), join_text, interval)
            async with aclosing(texts) as pieces:
                async for text in pieces:
                    first = False
                    yield text
        except Exception as error:
            if not first:
                logger.warning("request %s failed mid-stream: %s", prepared.request_id, error)
                # BentoML ends a stream normally on an Exception; this one aborts the
                # connection, so the client sees an incomplete response, not a short answer.
                raise StreamAborted(str(error)) from error
            raise as_api_error(error, "/generate", prepared.request_id) from None

    async def _texts(self, prepared: PreparedRequest) -> AsyncIterator[str]:
        async with aclosing(self.runtime.generator.stream(prepared)) as chunks:
            async for chunk in chunks:
                if chunk.text:
                    yield chunk.text

    @bentoml.api(input_spec=GenerateRequest)
    async def generate_text(self, **fields: Any) -> GenerateResponse:
        """The whole completion of `prompt` at once, with token counts and finish reason."""
        try:
            prepared = await self._admit(fields)
            generator = self.runtime.generator
            answer = await collect(prepared, answer_steps(generator, prepared))
        except Exception as error:
            response: JSONResponse = error_response(error, "/generate_text")
            return response  # type: ignore[return-value]
        # Absent optional fields are omitted, not null: BentoML's client decodes by the schema.
        response = await generator.offloader.run(
            answer.render_size, native_response, prepared, answer, generator.token_strings
        )
        body = response.model_dump(mode="json", exclude_none=True)
        return JSONResponse(body)  # type: ignore[return-value]


def _not_ready_reason() -> str | None:
    """Why this replica cannot serve now (None: it can), for vLLM's /health: what /readyz says."""
    service = _current_service()
    if service is None or service.chat is None:
        return "the model server is starting"
    return service.runtime.not_ready_reason()


TRTLLM.add_asgi_middleware(NativeErrorMiddleware)
TRTLLM.add_asgi_middleware(GuardMiddleware)
# /docs.json with the mounted apps' routes too (it is open: the guard passes it through). The
# live list: read at the first /docs.json, once every app below is mounted.
TRTLLM.add_asgi_middleware(OpenAPIDocsMiddleware, mounts=TRTLLM.mount_apps)
# /health, /tokenize, /detokenize and /tokenizer_info at the root, as vLLM serves them (BentoML's
# mounts answer only the paths their routes match, so the root stays BentoML's).
TRTLLM.mount_asgi_app(root_app(_current_chat, _not_ready_reason), path="/")


def _triton_metrics_url() -> str | None:
    service = _current_service()
    return service.runtime.triton_metrics_url() if service is not None else None


if load_settings().export_triton_metrics:
    TRTLLM.mount_asgi_app(build_triton_metrics_app(_triton_metrics_url), path="/triton")
