"""The `/v1` ASGI app (Starlette) that the BentoML service mounts: OpenAI's completions, chat
completions and models, the routes of the other APIs served under /v1 (:mod:`..api_surface`),
and error objects for unknown paths and methods (:mod:`..web.endpoints`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ...settings import load_settings
from ..chat.core import ChatCore
from ..web.endpoints import ALL_METHODS, CoreProvider, Endpoints, no_route, streaming_response
from .completions import CompletionServing
from .protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from .serving import OpenAIServing


def card(core: ChatCore, name: str, created: int) -> ModelCard:
    """A served model's card: the base model's carries its quantization (its adapters too)."""
    image_token = core.vision.image_token if core.vision is not None else None
    return ModelCard(
        id=name, created=created, quantization=core.quantization, image_token=image_token
    )


def build_openai_app(
    get_core: CoreProvider,
    extra_routes: Callable[[Endpoints], Sequence[BaseRoute]] | None = None,
) -> Starlette:
    """Routes for `/v1`; `get_core` returns None while the service is not ready (503).
    `extra_routes`: the routes of the other APIs served under /v1 (:mod:`..api_surface`)."""
    endpoints = Endpoints(get_core)
    parse, handler = endpoints.parse, endpoints.handler
    add_special_tokens = load_settings().completions_add_special_tokens

    def current() -> OpenAIServing:
        return OpenAIServing(endpoints.core())

    async def completions(request: Request) -> Response:
        server = CompletionServing(endpoints.core(), add_special_tokens)
        parsed, size = await parse(request, server.core, CompletionRequest)
        assert isinstance(parsed, CompletionRequest)
        plan = await server.prepare(parsed, size)
        if parsed.stream:
            events = server.stream(plan, parsed.usage_report())
            return await streaming_response(events, server.core.stream_interval)
        body = await server.complete(plan, parsed)
        return Response(body, media_type="application/json")

    async def chat_completions(request: Request) -> Response:
        server = current()
        parsed, size = await parse(request, server.core, ChatCompletionRequest)
        assert isinstance(parsed, ChatCompletionRequest)
        prepared, plan = await server.prepare_chat(parsed, size)
        if parsed.stream:
            events = server.stream_chat(prepared, parsed.usage_report(), plan)
            return await streaming_response(events, server.core.stream_interval)
        answer = await server.chat(prepared, plan, parsed.prompt_logprobs)
        return JSONResponse(answer.to_json())

    async def models(request: Request) -> Response:
        core = endpoints.core()
        now = int(time.time())
        cards = [card(core, name, now) for name in core.model_names()]
        return JSONResponse(ModelList(data=cards).model_dump(exclude_none=True))

    async def model(request: Request) -> Response:
        core = endpoints.core()
        name = str(request.path_params["model_id"])
        if name not in core.model_names():
            raise core.unknown_model(name)
        return JSONResponse(card(core, name, int(time.time())).model_dump(exclude_none=True))

    return Starlette(
        routes=[
            Route("/completions", handler(completions), methods=["POST"]),
            Route("/chat/completions", handler(chat_completions), methods=["POST"]),
            Route("/models", handler(models), methods=["GET"]),
            Route("/models/{model_id:path}", handler(model), methods=["GET"]),
            *(extra_routes(endpoints) if extra_routes is not None else ()),
            Route("/{path:path}", no_route, methods=ALL_METHODS),
        ]
    )
