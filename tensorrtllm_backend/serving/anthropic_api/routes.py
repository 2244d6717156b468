"""The `/v1/messages` routes. Errors are Anthropic's error objects:
``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..openai_api.routes import (
    ServingProvider,
    _parse,
    _streaming_response,
    current_serving,
    openai_endpoint,
)
from ..openai_api.serving import OpenAIError
from .messages import API_LABEL, MessagesServing
from .protocol import CountTokensRequest, MessagesRequest

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error(error: OpenAIError) -> JSONResponse:
    kind = ERROR_TYPES.get(
        error.status, "api_error" if error.status >= 500 else "invalid_request_error"
    )
    body = {"type": "error", "error": {"type": kind, "message": str(error)}}
    headers = {"Retry-After": "5"} if error.status in (429, 503) else None
    return JSONResponse(body, status_code=error.status, headers=headers)


def messages_routes(get_serving: ServingProvider) -> list[Route]:
    """The routes, relative to `/v1`."""

    def current() -> MessagesServing:
        return MessagesServing(current_serving(get_serving))

    async def create(request: Request) -> Response:
        parsed = await _parse(request, MessagesRequest)
        assert isinstance(parsed, MessagesRequest)
        server = current()
        prepared, plan = await server.prepare(parsed)
        if parsed.stream:
            events = server.stream(prepared, plan, parsed.model)
            return await _streaming_response(events, server.serving.stream_interval)
        return JSONResponse(await server.create(prepared, plan, parsed.model))

    async def count_tokens(request: Request) -> Response:
        parsed = await _parse(request, CountTokensRequest)
        assert isinstance(parsed, CountTokensRequest)
        return JSONResponse(current().count_tokens(parsed))

    return [
        Route("/messages", openai_endpoint(create, API_LABEL, anthropic_error), methods=["POST"]),
        Route(
            "/messages/count_tokens",
            openai_endpoint(count_tokens, render=anthropic_error),
            methods=["POST"],
        ),
    ]
