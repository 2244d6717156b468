"""What the HTTP routes of every API share: the chat core of the served model (503 while it
loads), request bodies parsed off the event loop when large, with unknown fields logged once and
the API's refused fields answered 400, errors in the style the registry gives the path, streamed
answers that start once their first event exists, and unknown paths under /v1.

Errors are the error objects of each API's style with proper status codes (the one mapper,
:mod:`..errors`, reading the registry, :mod:`..apis`); a request body that is not valid JSON or
not a valid request is a 400 that names the field. The guard in front has already checked the
body's size (:mod:`..guard`).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import pydantic_core
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Match

from ...common.engine_api import EngineError, EngineUnavailableError
from ..chat.core import ChatCore
from ..chat.request import unknown_fields
from ..errors import answer_for, error_response
from ..request_errors import RequestError
from ..streaming import coalesce, join_text
from .sse import sse

logger = logging.getLogger(__name__)

CoreProvider = Callable[[], ChatCore | None]
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


def validate_body(body: bytes, model: type[BaseModel]) -> tuple[BaseModel, list[str]]:
    """The request model of a body, and the unknown fields it carries (blocking: a large body is
    parsed in the offloader's threads). A model with an `unsupported()` method names there the
    first field it was sent that cannot be honoured (a 400).

    Parsed first, then validated: pydantic's one-step model_validate_json holds the GIL for the
    whole body, 35-60 ms for a megabyte of tools on a loaded machine, stalling the event loop
    from the offloader's thread; parsing alone takes a fifth of that. The models are strict
    either way (a test compares both on the bad-input table)."""
    try:
        data = pydantic_core.from_json(body)
    except ValueError as error:
        raise RequestError(f"the request body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    parsed = model.model_validate(data)
    unsupported = getattr(parsed, "unsupported", None)
    refused = unsupported() if unsupported is not None else None
    if refused is not None:
        raise RequestError(refused[1], param=refused[0])
    return parsed, unknown_fields(parsed)


class Endpoints:
    """What the routes of every API share: the chat core (503 while the model loads), request
    bodies parsed off the event loop when large with unknown fields logged once, and errors
    answered in the style the registry gives the path."""

    def __init__(self, get_core: CoreProvider) -> None:
        """`get_core` returns None while the service is not ready."""
        self._get_core = get_core
        self._unknown_log = UnknownFieldLog()

    def core(self) -> ChatCore:
        current = self._get_core()
        if current is None:
            raise EngineUnavailableError("the model is still loading")
        return current

    async def parse(
        self, request: Request, core: ChatCore, model: type[BaseModel]
    ) -> tuple[BaseModel, int]:
        """The request's body as `model`, and its size in bytes."""
        body = await request.body()
        offloader = core.generator.offloader
        parsed, unknown = await offloader.run(len(body), validate_body, body, model)
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


class RunServer(Protocol):
    """An API's server of runs: a request prepared into a run, answered streamed or whole."""

    core: ChatCore

    async def prepare(self, request: Any, size: int) -> Any: ...

    def stream(self, run: Any) -> AsyncIterator[str]: ...

    async def create(self, run: Any) -> dict[str, Any]: ...


def create_endpoint(
    endpoints: Endpoints, model: type[BaseModel], current: Callable[[], RunServer]
) -> Endpoint:
    """`POST` of an API whose body is `model` (with a `stream` field): the run that `current()`'s
    server prepares, streamed or whole."""

    async def create(request: Request) -> Response:
        server = current()
        parsed, size = await endpoints.parse(request, server.core, model)
        run = await server.prepare(parsed, size)
        if getattr(parsed, "stream", False):
            return await streaming_response(server.stream(run), server.core.stream_interval)
        return JSONResponse(await server.create(run))

    return create


async def no_route(request: Request) -> Response:
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
            RequestError(f"{request.method} is not allowed on {path}", 405), path
        )
        response.headers["Allow"] = ", ".join(
            sorted({method for route in partial for method in route.methods or ()})
        )
        return response
    message = f"{path} does not exist here (see docs/api.md for the routes)"
    return error_response(RequestError(message, 404), path)


async def streaming_response(events: AsyncIterator[str], interval: int) -> StreamingResponse:
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
