"""The `/v1` ASGI app (Starlette) that the BentoML service mounts.

Errors are OpenAI error objects with proper status codes; a request body that is not valid JSON
or not a valid request is a 400 that names the field.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Match, Route

from ...common.engine_api import EngineModelError, EngineUnavailableError
from ..metrics import generation_metrics
from ..streaming import coalesce, join_text
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorDetail,
    ErrorResponse,
    ModelCard,
    ModelList,
    _SamplingFields,
    unknown_fields,
)
from .serving import OpenAIError, OpenAIServing
from .streams import sse

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024
ServingProvider = Callable[[], OpenAIServing | None]
Endpoint = Callable[[Request], Awaitable[Response]]
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def error_response(error: OpenAIError, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(
        error=ErrorDetail(message=str(error), type=error.kind, param=error.param, code=error.code)
    )
    if error.status in (429, 503):
        headers = {**(headers or {}), "Retry-After": "5"}
    return JSONResponse(body.model_dump(), status_code=error.status, headers=headers)


def _as_openai_error(error: Exception) -> OpenAIError:
    if isinstance(error, OpenAIError):
        return error
    if isinstance(error, EngineUnavailableError):
        return OpenAIError(
            f"the model server is not available, retry shortly: {error}", 503, "server_error"
        )
    if isinstance(error, EngineModelError):
        return OpenAIError(f"the model failed on this request: {error}", 502, "server_error")
    raise error


def _validation_message(error: ValidationError) -> tuple[str, str | None]:
    first = error.errors(include_url=False)[0]
    location = ".".join(str(part) for part in first.get("loc", ()))
    return f"{location}: {first.get('msg')}" if location else str(
        first.get("msg")
    ), location or None


async def _parse(request: Request, model: type[BaseModel]) -> BaseModel:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise OpenAIError(f"request body is larger than {MAX_BODY_BYTES} bytes", 413)
    try:
        parsed = model.model_validate_json(body)
    except ValidationError as error:
        message, param = _validation_message(error)
        if any(e.get("type") == "json_invalid" for e in error.errors()):
            message = "the request body is not valid JSON"
        raise OpenAIError(message, 400, param=param) from None
    if isinstance(parsed, _SamplingFields):
        refused = parsed.unsupported()
        if refused is not None:
            raise OpenAIError(refused[1], 400, param=refused[0])
    unknown = unknown_fields(parsed)
    if unknown:
        logger.warning("%s: ignoring unknown field(s) %s", request.url.path, ", ".join(unknown))
    return parsed


def current_serving(get_serving: ServingProvider) -> OpenAIServing:
    """The serving object, or a 503 while the service is not ready."""
    current = get_serving()
    if current is None:
        raise OpenAIError("the model is still loading, retry shortly", 503, "server_error")
    return current


def openai_endpoint(
    body: Endpoint,
    api: str | None = None,
    render: Callable[[OpenAIError], Response] = error_response,
) -> Endpoint:
    """An endpoint whose errors are answered by `render` (OpenAI error objects by default);
    `api`: the metrics label its rejected requests are counted under (generation APIs only)."""

    async def endpoint(request: Request) -> Response:
        try:
            return await body(request)
        except Exception as error:
            failure = _as_openai_error(error)
            if api is not None and 400 <= failure.status < 500:
                generation_metrics().record_rejected(api, "invalid_request")
            return render(failure)

    return endpoint


async def _no_route(request: Request) -> Response:
    """Unknown paths and methods under /v1 answer OpenAI error objects, not plain text: a
    catch-all route (BentoML's mount sends a path here only when a route of the app matches
    it)."""
    partial = [
        route
        for route in request.app.router.routes
        if route.matches(request.scope)[0] is Match.PARTIAL
    ]
    if partial:
        allowed = sorted({method for route in partial for method in route.methods or ()})
        error = OpenAIError(f"{request.method} is not allowed on {request.url.path}", 405)
        return error_response(error, {"Allow": ", ".join(allowed)})
    message = f"{request.url.path} does not exist here (see docs/api.md for the routes)"
    return error_response(OpenAIError(message, 404))


def build_openai_app(
    get_serving: ServingProvider, extra_routes: Sequence[BaseRoute] = ()
) -> Starlette:
    """Routes for `/v1`; `get_serving` returns None while the service is not ready (503).
    `extra_routes`: the routes of the other APIs served under /v1 (:mod:`..api_surface`)."""

    def serving() -> OpenAIServing:
        return current_serving(get_serving)

    async def completions(request: Request) -> Response:
        parsed = await _parse(request, CompletionRequest)
        assert isinstance(parsed, CompletionRequest)
        server = serving()
        prepared = await server.prepare_completion(parsed)
        if parsed.stream:
            events = server.stream_completion(prepared, parsed.usage_report())
            return await _streaming_response(events, server.stream_interval)
        response = await server.complete(prepared, parsed)
        return JSONResponse(response.model_dump(exclude_none=True))

    async def chat_completions(request: Request) -> Response:
        parsed = await _parse(request, ChatCompletionRequest)
        assert isinstance(parsed, ChatCompletionRequest)
        server = serving()
        prepared, plan = await server.prepare_chat(parsed)
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
            Route(
                "/completions", openai_endpoint(completions, "openai_completions"), methods=["POST"]
            ),
            Route(
                "/chat/completions",
                openai_endpoint(chat_completions, "openai_chat"),
                methods=["POST"],
            ),
            Route("/models", openai_endpoint(models), methods=["GET"]),
            Route("/models/{model_id:path}", openai_endpoint(model), methods=["GET"]),
            *extra_routes,
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
        except (EngineUnavailableError, EngineModelError) as error:
            failure = _as_openai_error(error)
            yield sse({"error": {"message": str(failure), "type": failure.kind, "code": None}})

    return StreamingResponse(body(), media_type="text/event-stream")
