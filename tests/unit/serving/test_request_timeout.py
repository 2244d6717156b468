"""InlineTimeoutMiddleware: BentoML's request timeout (504 when the response has not started in
time) without a task per request, and BentoML building its apps with it."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from bentoml._internal.server.base_app import BaseAppFactory
from bentoml._internal.server.http import traffic

from tensorrtllm_backend.serving.request_timeout import (
    InlineTimeoutMiddleware,
    run_request_timeout_inline,
)

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout")

SCOPE = {"type": "http", "path": "/generate", "method": "POST", "headers": []}


class Sent(list[dict[str, Any]]):
    async def __call__(self, message: dict[str, Any]) -> None:
        self.append(message)


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def test_an_api_that_does_not_answer_in_time_gets_bentomls_504() -> None:
    cancelled = asyncio.Event()

    async def api(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    sent = Sent()
    await asyncio.wait_for(InlineTimeoutMiddleware(api, timeout=0.05)(SCOPE, receive, sent), 5)
    assert cancelled.is_set() and sent[0]["status"] == 504
    assert json.loads(sent[1]["body"]) == {
        "error": "Not able to process the request in 0.05 seconds"
    }
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_the_clock_stops_when_the_response_starts_and_the_api_runs_in_this_task() -> None:
    tasks = []

    async def api(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        tasks.append(asyncio.current_task())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(0.15)  # a stream longer than the timeout
        await send({"type": "http.response.body", "body": b"done"})

    sent = Sent()
    await InlineTimeoutMiddleware(api, timeout=0.05)(SCOPE, receive, sent)
    assert tasks == [asyncio.current_task()]
    assert [m.get("status") for m in sent] == [200, None] and sent[1]["body"] == b"done"


async def test_the_apis_own_timeout_error_is_not_taken_for_the_deadline() -> None:
    async def api(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        raise TimeoutError("the API's own")

    with pytest.raises(TimeoutError, match="the API's own"):
        await InlineTimeoutMiddleware(api, timeout=5)(SCOPE, receive, Sent())


def test_bentoml_builds_its_apps_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traffic, "TimeoutMiddleware", traffic.TimeoutMiddleware)
    run_request_timeout_inline()
    factory = type("App", (), {"timeout": 60, "max_concurrency": None})()
    (middleware,) = BaseAppFactory.middlewares.fget(factory)  # type: ignore[attr-defined]
    assert middleware.cls is InlineTimeoutMiddleware and middleware.kwargs == {"timeout": 60}


async def test_an_api_that_answers_when_cancelled_keeps_its_answer() -> None:
    """The deadline cancels the API, which answers anyway on its way out: that answer stands
    (the clock is not rescheduled once it has run out), and no 504 follows it."""

    async def api(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b"going away"})

    sent = Sent()
    await asyncio.wait_for(InlineTimeoutMiddleware(api, timeout=0.05)(SCOPE, receive, sent), 5)
    assert [m.get("status") for m in sent] == [503, None]
