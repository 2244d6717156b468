"""The `/v1` ASGI app (Starlette) that the BentoML service mounts.

Errors are the error objects of each API's style with proper status codes (the one mapper,
:mod:`..errors`, reading the registry, :mod:`..apis`); a request body that is not valid JSON or
not a valid request is a 400 that names the field. The guard in front has already checked the
body's size (:mod:`..guard`); a large body is parsed off the event loop. :class:`Endpoints`
holds what every route shares, the ones of the other APIs under /v1 (:mod:`..api_surface`)
included; unknown paths and methods under /v1 answer error objects too.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pydantic_core
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Match, Route

from ...common.engine_api import EngineError, EngineUnavailableError
from ..errors import answer_for, error_response
from ..streaming import coalesce, join_text
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    _SamplingFields,
    unknown_fields,
)
from .serving import OpenAIError, OpenAIServing
from .streams import sse

logger = logging.getLogger(__name__)

ServingProvider = Callable[[], OpenAIServing | None]
Endpoint = Callable[[Request], Awaitable[Response]]
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_INDEX = re.compile(r"\[\d+\]")


class UnknownFieldLog:
    """Logs the names of fields clients send that no model here declares: each name once
    (list positions folded: `tools[3].x` and `tools[7].x` are `tools[].x`), truncated to
    `max_chars` and escaped (a name is the client's text: newlines, control characters, any
    length), and at most `max_names` names remembered, so memory stays bounded whatever
    clients send."""

    def __init__(self, max_names: int = 1024, max_chars: int = 64) -> None:
        self.max_names = max_names
        self.max_chars = max_chars
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def note(self, path: str, names: list[str]) -> None:
        fresh: list[str] = []
        with self._lock:
            for raw in names:
                folded = _INDEX.sub("[]", raw[: self.max_chars * 4])
                name = folded[: self.max_chars]
                if name in self._seen:
                    continue
                if len(self._seen) >= self.max_names:
                    break
                self._seen.add(name)
                cut = len(folded) > len(name) or len(raw) > self.max_chars * 4
                fresh.append(ascii(name)[1:-1] + ("..." if cut else ""))
        if fresh:
            logger.warning(
                "%s: ignoring unknown field(s) %s (each name is logged once)",
                path, ", ".join(fresh),
            )  # fmt: skip


def _validate(body: bytes, model: type[BaseModel]) -> tuple[BaseModel, list[str]]:
    """The request model of a body, and the unknown fields it carries (blocking: a large body is
    parsed in the offloader's threads).

    Parsed first, then validated: pydantic's one-step model_validate_json holds the GIL for the
    whole body, 35-60 ms for a megabyte of tools on a loaded machine, stalling the event loop
    from the offloader's thread; parsing alone takes a fifth of that. The models are strict
    either way (a test compares both on the bad-input table)."""
    try:
        data = pydantic_core.from_json(body)
    except ValueError as error:
        raise OpenAIError(f"the request body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise OpenAIError("the request body must be a JSON object")
    parsed = model.model_validate(data)
    if isinstance(parsed, _SamplingFields):
        refused = parsed.unsupported()
        if refused is not None:
            raise OpenAIError(refused[1], 400, param=refused[0])
    return parsed, unknown_fields(parsed)


class Endpoints:
    """What the routes of the OpenAI adapter, and of the APIs served over it, share: the serving
    object (503 while the model loads), request bodies parsed off the event loop when large with
    unknown fields logged once, and errors answered in the style the registry gives the path."""

    def __init__(self, get_serving: ServingProvider) -> None:
        """`get_serving` returns None while the service is not ready."""
        self._get_serving = get_serving
        self._unknown_log = UnknownFieldLog()

    def serving(self) -> OpenAIServing:
        current = self._get_serving()
        if current is None:
            raise EngineUnavailableError("the model is still loading")
        return current

    async def parse(
        self, request: Request, server: OpenAIServing, model: type[BaseModel]
    ) -> tuple[BaseModel, int]:
        """The request's body as `model`, and its size in bytes."""
        body = await request.body()
        parsed, unknown = await server.generator.offloader.run(len(body), _validate, body, model)
        if unknown:
            self._unknown_log.note(request.url.path, unknown)
        return parsed, len(body)

    @staticmethod
    def handler(body: Endpoint) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            try:
                return await body(request)
            except Exception as error:
                return error_response(error, request.url.path)

        return endpoint


async def _no_route(request: Request) -> Response:
    """Unknown paths and methods under /v1 answer error objects, not plain text: a catch-all
    route (BentoML's mount sends a path here only when a route of the app matches it)."""
    partial = [
        route
        for route in request.app.router.routes
        if route.matches(request.scope)[0] is Match.PARTIAL
    ]
    path = request.url.path
    if partial:
        response = error_response(
            OpenAIError(f"{request.method} is not allowed on {path}", 405), path
        )
        response.headers["Allow"] = ", ".join(
            sorted({method for route in partial for method in route.methods or ()})
        )
        return response
    message = f"{path} does not exist here (see docs/api.md for the routes)"
    return error_response(OpenAIError(message, 404), path)


def build_openai_app(
    get_serving: ServingProvider,
    extra_routes: Callable[[Endpoints], Sequence[BaseRoute]] | None = None,
) -> Starlette:
    """Routes for `/v1`; `get_serving` returns None while the service is not ready (503).
    `extra_routes`: the routes of the other APIs served under /v1 (:mod:`..api_surface`)."""
    endpoints = Endpoints(get_serving)
    serving, parse, handler = endpoints.serving, endpoints.parse, endpoints.handler

    async def completions(request: Request) -> Response:
        server = serving()
        parsed, size = await parse(request, server, CompletionRequest)
        assert isinstance(parsed, CompletionRequest)
        prepared = await server.prepare_completion(parsed, size)
        if parsed.stream:
            events = server.stream_completion(prepared, parsed.usage_report())
            return await _streaming_response(events, server.stream_interval)
        response = await server.complete(prepared, parsed)
        return JSONResponse(response.model_dump(exclude_none=True))

    async def chat_completions(request: Request) -> Response:
        server = serving()
        parsed, size = await parse(request, server, ChatCompletionRequest)
        assert isinstance(parsed, ChatCompletionRequest)
        prepared, plan = await server.prepare_chat(parsed, size)
        if parsed.stream:
            events = server.stream_chat(prepared, parsed.usage_report(), plan)
            return await _streaming_response(events, server.stream_interval)
        return JSONResponse((await server.chat(prepared, plan)).to_json())

    async def models(request: Request) -> Response:
        server = serving()
        now = int(time.time())
        cards = [ModelCard(id=name, created=now) for name in server.model_names()]
        return JSONResponse(ModelList(data=cards).model_dump())

    async def model(request: Request) -> Response:
        server = serving()
        name = str(request.path_params["model_id"])
        if name not in server.model_names():
            raise server.unknown_model(name)
        return JSONResponse(ModelCard(id=name, created=int(time.time())).model_dump())

    return Starlette(
        routes=[
            Route("/completions", handler(completions), methods=["POST"]),
            Route("/chat/completions", handler(chat_completions), methods=["POST"]),
            Route("/models", handler(models), methods=["GET"]),
            Route("/models/{model_id:path}", handler(model), methods=["GET"]),
            *(extra_routes(endpoints) if extra_routes is not None else ()),
            Route("/{path:path}", _no_route, methods=ALL_METHODS),
        ]
    )


async def _streaming_response(events: AsyncIterator[str], interval: int) -> StreamingResponse:
    """Start the stream once its first event exists, so a failure before it gets a real status
    (503, 400...). Errors after the first byte cannot change the status: they are sent as an SSE
    error event and the stream ends without [DONE]."""
    stream = coalesce(events, join_text, interval)
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        first = ""

    async def body() -> AsyncIterator[str]:
        if first:
            yield first
        try:
            async for event in stream:
                yield event
        except EngineError as error:
            failure = answer_for(error)
            yield sse({"error": {"message": failure.message, "type": failure.error_type,
                                 "code": None}})  # fmt: skip

    return StreamingResponse(body(), media_type="text/event-stream")
