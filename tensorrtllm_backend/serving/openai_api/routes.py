"""The `/v1` ASGI app (Starlette) that the BentoML service mounts.

Errors are OpenAI error objects with proper status codes (the one mapper, :mod:`..errors`); a
request body that is not valid JSON or not a valid request is a 400 that names the field. The
guard in front has already checked the body's size (:mod:`..guard`); a large body is parsed
off the event loop.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pydantic_core
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

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


def build_openai_app(get_serving: ServingProvider) -> Starlette:
    """Routes for `/v1`; `get_serving` returns None while the service is not ready (503)."""
    unknown_log = UnknownFieldLog()

    def serving() -> OpenAIServing:
        current = get_serving()
        if current is None:
            raise EngineUnavailableError("the model is still loading")
        return current

    async def parse(
        request: Request, server: OpenAIServing, model: type[BaseModel]
    ) -> tuple[BaseModel, int]:
        body = await request.body()
        parsed, unknown = await server.generator.offloader.run(len(body), _validate, body, model)
        if unknown:
            unknown_log.note(request.url.path, unknown)
        return parsed, len(body)

    def handler(
        body: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await body(request)
            except Exception as error:
                return error_response(error, request.url.path)

        return endpoint

    async def completions(request: Request) -> Response:
        server = serving()
        parsed, size = await parse(request, server, CompletionRequest)
        assert isinstance(parsed, CompletionRequest)
        prepared = await server.prepare_completion(parsed, size)
        if parsed.stream:
            events = server.stream_completion(prepared, _include_usage(parsed))
            return await _streaming_response(events, server.stream_interval)
        return JSONResponse((await server.complete(prepared)).model_dump(exclude_none=True))

    async def chat_completions(request: Request) -> Response:
        server = serving()
        parsed, size = await parse(request, server, ChatCompletionRequest)
        assert isinstance(parsed, ChatCompletionRequest)
        prepared, plan = await server.prepare_chat(parsed, size)
        if parsed.stream:
            events = server.stream_chat(prepared, _include_usage(parsed), plan)
            return await _streaming_response(events, server.stream_interval)
        return JSONResponse((await server.chat(prepared, plan)).to_json())

    async def models(request: Request) -> Response:
        server = serving()
        now = int(time.time())
        cards = [ModelCard(id=name, created=now) for name in server.model_names()]
        return JSONResponse(ModelList(data=cards).model_dump())

    return Starlette(
        routes=[
            Route("/completions", handler(completions), methods=["POST"]),
            Route("/chat/completions", handler(chat_completions), methods=["POST"]),
            Route("/models", handler(models), methods=["GET"]),
        ]
    )


def _include_usage(request: CompletionRequest | ChatCompletionRequest) -> bool:
    return bool(request.stream_options and request.stream_options.include_usage)


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
