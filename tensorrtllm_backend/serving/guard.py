"""ASGI middleware in front of every API: who may call it, how much it may send, how many
generations run at once, and how long a request lives.

For each request, in this order (what each API gets is read from the registry, :mod:`.apis`):

1. the optional API key (401), as a bearer token or as `x-api-key` (Anthropic's clients);
2. the body limit, TRTLLM_MAX_REQUEST_BYTES, on the declared Content-Length (413 at once);
3. the bound on generation requests in flight, TRTLLM_MAX_IN_FLIGHT (429 + Retry-After instead
   of an unbounded queue);
4. the body is read here, counting the bytes received (chunked uploads have no
   Content-Length): past the limit it is a 413 before more is buffered, and the API never
   starts;
5. the API runs while the client's connection is watched: when the client goes away before
   the answer is complete, the API is cancelled, so a generation nobody will
   read stops (its Triton request is cancelled, its slot freed), streamed or not, before its
   first token or after. BentoML and Starlette notice a disconnect only when they next write,
   i.e. never while a non-streamed request or a stream's first token is still being generated.
6. with several workers, a worker that runs more than its share of the service's generations
   answers with `Connection: close`, so that the client's next connection may go to another
   worker (:mod:`.worker_load`).

Health probes, metrics and the API schema stay open so orchestrators and clients can use them.
"""

from __future__ import annotations

import asyncio
import hmac
from collections import deque

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..settings import Settings, load_settings
from .apis import API, api_for
from .errors import ErrorAnswer, render
from .worker_load import board_for

# nginx's status for a request its client closed before the answer: what the access log shows.
CLIENT_CLOSED = 499
# The server closes the connection once the answer is sent (uvicorn reads the header too).
CLOSE = (b"connection", b"close")


class GuardMiddleware:
    def __init__(self, app: ASGIApp, settings: Settings | None = None) -> None:
        self.app = app
        self.settings = settings or load_settings()
        key = self.settings.api_key
        self._expected = f"Bearer {key.get_secret_value()}".encode() if key else None
        self._key = key.get_secret_value().encode() if key else None
        self.in_flight = 0
        self.board = board_for(self.settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api = api_for(scope.get("path", ""))
        if api.open:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self._expected is not None and not self._authorized(headers):
            answer = ErrorAnswer(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>' or "
                "'x-api-key: <key>'",
            )
            await _reject(scope, receive, send, api, answer, {"WWW-Authenticate": "Bearer"})
            return
        limit = self.settings.max_request_bytes
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _reject(scope, receive, send, api, _too_large(limit))
            return
        if not api.generation:
            await self._admitted(scope, receive, send, api)
            return
        bound = self.settings.max_in_flight
        if self.in_flight >= bound:
            answer = ErrorAnswer(429, f"too many requests in flight (limit {bound}): retry shortly")
            await _reject(scope, receive, send, api, answer)
            return
        self.in_flight += 1
        board = self.board
        release = board.admit(self.in_flight) if board is not None else False
        try:
            await self._admitted(scope, receive, send, api, release)
        finally:
            self.in_flight -= 1
            if board is not None:
                board.leave(self.in_flight, release)

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        """The key as OpenAI clients send it (a bearer token) or as Anthropic's do (x-api-key)."""
        assert self._expected is not None and self._key is not None
        bearer = hmac.compare_digest(headers.get(b"authorization", b""), self._expected)
        return bearer or hmac.compare_digest(headers.get(b"x-api-key", b""), self._key)

    async def _admitted(
        self, scope: Scope, receive: Receive, send: Send, api: API, release: bool = False
    ) -> None:
        """Read the body and run the API; `release`: close the connection after the answer."""
        body = await _read_body(receive, self.settings.max_request_bytes)
        if body is None:  # the client left while sending
            await _answer_departed(send)
            return
        if isinstance(body, int):
            await _reject(scope, receive, send, api, _too_large(body))
            return
        await _run_while_connected(self.app, scope, receive, send, body, release)


def _too_large(limit: int) -> ErrorAnswer:
    return ErrorAnswer(
        413,
        f"request body is larger than {limit} bytes (TRTLLM_MAX_REQUEST_BYTES): send less",
    )


async def _reject(
    scope: Scope, receive: Receive, send: Send, api: API, answer: ErrorAnswer,
    headers: dict[str, str] | None = None,
) -> None:  # fmt: skip
    response = render(answer, api.errors)
    if headers:
        response.headers.update(headers)
    await response(scope, receive, send)


async def _read_body(receive: Receive, limit: int) -> deque[Message] | int | None:
    """The request's body messages; `limit` (int) when more than `limit` bytes arrive, None
    when the client disconnects first."""
    messages: deque[Message] = deque()
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        received += len(message.get("body", b""))
        if received > limit:
            return limit
        messages.append(message)
        if not message.get("more_body", False):
            return messages


async def _run_while_connected(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, body: deque[Message],
    release: bool = False,
) -> None:  # fmt: skip
    """Run the API on the body already read, in this task; cancel it if the client disconnects
    before the response is complete. `release`: the answer says `Connection: close`.

    Once the body is read, the server's `receive` only reports the end of the connection (or
    of the response). One watcher task waits for it, beside the API and off its way to the first
    token. The API runs inline, not in a task of its own: on a busy event loop every task start
    on the way to the first token waits a turn behind the other streams' tokens
    (docs/streaming-path.md, "Event-loop turns before the first token").

    The API sees ASGI spec 2.4: its `send` raises OSError once the client is gone, so Starlette
    streams in the request's task instead of starting one to listen for the disconnect (this
    watcher does that). Its own `receive` calls, after the body, get the watcher's message.
    """
    started = complete = gone = running = False
    ended: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
    task = asyncio.current_task()
    assert task is not None

    async def replay() -> Message:
        if body:
            return body.popleft()
        return await asyncio.shield(ended)

    async def send_watched(message: Message) -> None:
        nonlocal started, complete
        if gone:
            raise OSError("the client closed the connection")
        if message["type"] == "http.response.start":
            started = True
            if release:
                message = {**message, "headers": [*message.get("headers", ()), CLOSE]}
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            complete = True
        await send(message)

    async def watch() -> None:
        nonlocal gone
        try:
            message = await receive()
        except Exception:  # the server cannot tell any more: take it as the end
            message = {"type": "http.disconnect"}
        ended.set_result(message)
        if message["type"] == "http.disconnect" and not complete and running:
            gone = True
            task.cancel()

    scope["asgi"] = {**scope.get("asgi", {}), "spec_version": "2.4"}
    watcher = asyncio.ensure_future(watch())
    running = True
    try:
        await app(scope, replay, send_watched)
    except asyncio.CancelledError:
        if not gone:  # the server cancels this request (shutdown): the API went with it
            raise
    finally:
        running = False
        watcher.cancel()
        if gone:
            _uncancel(task)
    if gone and not started:
        await _answer_departed(send)


def _uncancel(task: asyncio.Task[object]) -> None:
    """Take back the watcher's cancellation once the API has ended (Python >= 3.11 counts
    cancellations, and a count left behind would cancel the next `asyncio.timeout` of the
    task)."""
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None and task.cancelling():
        uncancel()


async def _answer_departed(send: Send) -> None:
    """End the request of a client that left with an answer (the server drops it: nobody
    reads it), so that the middlewares outside see it answered: BentoML's timeout middleware
    otherwise holds the request until its timeout (10 minutes), and a stopping server waits
    for it."""
    await send({"type": "http.response.start", "status": CLIENT_CLOSED, "headers": []})
    await send({"type": "http.response.body", "body": b""})
