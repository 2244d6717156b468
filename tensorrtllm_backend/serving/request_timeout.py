"""BentoML's request timeout (`traffic.timeout`), enforced in the request's own task.

BentoML's `TimeoutMiddleware` answers 504 when an API has not started its response within the
timeout. It runs the rest of the app in a new task to do so, and on a busy event loop a task
start waits a turn behind the other streams' tokens: one more wait on every request's way to its
first token (docs/streaming-path.md, "Event-loop turns before the first token"). This subclass keeps
its behaviour (the same 504 and message, the clock stopping at the response's start) with
`asyncio.timeout` around the app instead, which cancels the request's own task when it fires.
`run_request_timeout_inline()` puts it where BentoML looks the class up when it builds a worker's
app; BentoCloud still reads `traffic.timeout` as before.
"""

from __future__ import annotations

import asyncio

from bentoml._internal.server.http import traffic
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

_BENTOML_TIMEOUT = traffic.TimeoutMiddleware


class InlineTimeoutMiddleware(_BENTOML_TIMEOUT):  # type: ignore[misc,valid-type]
    """`TimeoutMiddleware` without a task per request (Python >= 3.11: `asyncio.timeout`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        deadline = asyncio.timeout(self.timeout)
        started = False

        async def send_started(message: Message) -> None:
            nonlocal started
            if not started:
                started = True
                if not deadline.expired():
                    deadline.reschedule(None)  # the clock covers only the wait for the response
            await send(message)

        try:
            async with deadline:
                await self.app(scope, receive, send_started)
        except TimeoutError:
            if not deadline.expired():  # the API's own TimeoutError
                raise
            if started:  # the clock ran out as the response began: uvicorn ends it
                return
            response = JSONResponse(
                {"error": f"Not able to process the request in {self.timeout} seconds"},
                status_code=504,
            )
            await response(scope, receive, send)


def run_request_timeout_inline() -> None:
    """Have BentoML build its workers' apps with InlineTimeoutMiddleware."""
    traffic.TimeoutMiddleware = InlineTimeoutMiddleware  # type: ignore[misc]
