"""The `/v1/messages` routes. Their errors are Anthropic's error objects
(``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``): the
registry gives these paths Anthropic's style (:mod:`..apis`)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..chat.core import OFF_LOOP
from ..web.endpoints import Endpoints, create_endpoint
from .messages import MessagesServing
from .protocol import CountTokensRequest, MessagesRequest


def messages_routes(endpoints: Endpoints) -> list[Route]:
    """The routes, relative to `/v1`."""
    handler = endpoints.handler

    def current() -> MessagesServing:
        return MessagesServing(endpoints.core())

    create = create_endpoint(endpoints, MessagesRequest, current)

    async def count_tokens(request: Request) -> Response:
        server = current()
        parsed, _size = await endpoints.parse(request, server.core, CountTokensRequest)
        assert isinstance(parsed, CountTokensRequest)
        offloader = server.core.generator.offloader
        # Off the loop whatever the size: messages may hold image URLs to fetch.
        return JSONResponse(await offloader.run(OFF_LOOP, server.count_tokens, parsed))

    return [
        Route("/messages", handler(create), methods=["POST"]),
        Route("/messages/count_tokens", handler(count_tokens), methods=["POST"]),
    ]
