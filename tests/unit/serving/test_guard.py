"""GuardMiddleware at the ASGI level: the body limit on the bytes received (chunked too) before
the API starts, the in-flight bound, the API key, and cancellation when the client leaves.
`bentoml serve` runs the same middleware in tests/integration (test_hostile_traffic.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tensorrtllm_backend.serving.errors import RETRY_AFTER_S
from tensorrtllm_backend.serving.guard import GuardMiddleware
from tensorrtllm_backend.settings import Settings

LIMIT = 1000


class Client:
    """The server side of one request: body messages to hand out, then (when `leave` is set) a
    disconnect; records what the middleware sends and how many messages it read."""

    def __init__(
        self, chunks: list[bytes], headers: dict[bytes, bytes] | None = None,
        complete: bool = True,
    ) -> None:  # fmt: skip
        self.chunks = list(chunks)
        self.complete = complete  # False: the client leaves before its body's end
        self.read = 0
        self.sent: list[dict[str, Any]] = []
        self.leave = asyncio.Event()
        self.scope_headers = list((headers or {}).items())

    async def receive(self) -> dict[str, Any]:
        if self.read < len(self.chunks):
            self.read += 1
            more = self.read < len(self.chunks) or not self.complete
            return {"type": "http.request", "body": self.chunks[self.read - 1], "more_body": more}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.leave.set()  # as uvicorn: once the response is complete, receive() ends

    def scope(self, path: str) -> dict[str, Any]:
        return {"type": "http", "path": path, "method": "POST", "headers": self.scope_headers}

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def body(self) -> Any:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))


class App:
    """An API that records the body it read and can be told to wait (a generation)."""

    def __init__(self, stream_first: bool = False) -> None:
        self.body = b""
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False
        self.stream_first = stream_first
        self.later: list[dict[str, Any]] = []

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        while True:
            message = await receive()
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            if self.stream_first:
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b"first", "more_body": True})
            self.started.set()
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if not self.stream_first:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})
        self.later.append(await receive())  # after the response: the end of the connection


def guard(app: Any, **settings: Any) -> GuardMiddleware:
    return GuardMiddleware(app, Settings(max_request_bytes=LIMIT, **settings))


async def started(middleware: GuardMiddleware, app: App, path: str) -> tuple[Client, Any]:
    """A request to `path` under way in the app (the app waits for `release`): its client, and
    the task serving it."""
    client = Client([b"{}"])
    served = asyncio.ensure_future(middleware(client.scope(path), client.receive, client.send))
    await asyncio.wait_for(app.started.wait(), 5)
    return client, served


@pytest.mark.parametrize("path", ["/generate_text", "/v1/completions"])
async def test_a_chunked_body_over_the_limit_is_a_413_before_the_api_starts(path: str) -> None:
    app = App()
    client = Client([b"x" * 600, b"x" * 600, b"x" * 600])  # no Content-Length
    await guard(app)(client.scope(path), client.receive, client.send)
    assert client.status == 413 and not app.started.is_set() and app.body == b""
    assert client.read == 2, "the guard reads no further than the chunk that crossed the limit"
    message = client.body["error"]
    text = message["message"] if isinstance(message, dict) else message
    assert f"larger than {LIMIT} bytes" in text and "TRTLLM_MAX_REQUEST_BYTES" in text


async def test_a_declared_length_over_the_limit_is_refused_unread() -> None:
    client = Client([b"x" * 10], {b"content-length": str(LIMIT + 1).encode()})
    await guard(App())(client.scope("/generate"), client.receive, client.send)
    assert client.status == 413 and client.read == 0


async def test_a_client_that_leaves_while_sending_gets_an_answer_nobody_reads() -> None:
    """The request still ends with a complete answer (499), or BentoML's timeout middleware
    outside would hold it until its timeout, and a stopping server would wait for it."""
    app = App()
    client = Client([b"{"], complete=False)
    client.leave.set()
    await asyncio.wait_for(guard(app)(client.scope("/generate"), client.receive, client.send), 5)
    assert not app.started.is_set() and client.status == 499
    assert client.sent[-1] == {"type": "http.response.body", "body": b""}


async def test_a_body_within_the_limit_reaches_the_api_whole() -> None:
    app = App()
    app.release.set()
    chunks = [b"a" * 400, b"b" * 400, b"c" * 200]  # exactly the limit
    client = Client(chunks)
    await guard(app)(client.scope("/generate_text"), client.receive, client.send)
    assert app.body == b"".join(chunks) and client.status == 200 and not app.cancelled
    assert app.later == [{"type": "http.disconnect"}]


@pytest.mark.parametrize("stream_first", [False, True], ids=["waiting", "streaming"])
async def test_the_api_is_cancelled_when_the_client_leaves(stream_first: bool) -> None:
    app = App(stream_first)
    middleware = guard(app)
    client, served = await started(middleware, app, "/generate")
    assert middleware.in_flight == 1
    client.leave.set()  # the client disconnects while the answer is not complete
    await asyncio.wait_for(served, 5)
    assert app.cancelled and middleware.in_flight == 0
    assert client.status == (200 if stream_first else 499)  # an answer ends the request


async def test_a_complete_answer_is_not_cancelled_by_the_connection_ending() -> None:
    app = App()
    client, served = await started(guard(app), app, "/v1/models")
    app.release.set()
    await asyncio.wait_for(served, 5)
    assert not app.cancelled and client.status == 200


async def test_a_server_cancelling_the_request_cancels_the_api() -> None:
    app = App()
    _client, served = await started(guard(app), app, "/generate")
    served.cancel()
    with pytest.raises(asyncio.CancelledError):
        await served
    assert app.cancelled


async def test_requests_beyond_the_in_flight_bound_get_429_with_retry_after() -> None:
    app = App()
    middleware = guard(app, max_in_flight=1)
    _first, served = await started(middleware, app, "/generate")
    for path in ("/generate_text", "/v1/chat/completions"):
        second = Client([b"{}"])
        await middleware(second.scope(path), second.receive, second.send)
        assert second.status == 429 and second.read == 0
        headers = dict(second.sent[0]["headers"])
        assert headers[b"retry-after"] == str(RETRY_AFTER_S).encode()
    assert second.body["error"]["type"] == "rate_limit_error"  # /v1: OpenAI's error object
    models = Client([b""])  # not a generation API: not counted
    app.release.set()
    await asyncio.wait_for(served, 5)
    await middleware(models.scope("/v1/models"), models.receive, models.send)
    assert models.status == 200 and middleware.in_flight == 0


async def test_the_api_key_is_checked_and_open_paths_stay_open() -> None:
    app = App()
    app.release.set()
    middleware = guard(app, api_key="sekrit")
    refused = Client([b"{}"])
    await middleware(refused.scope("/generate"), refused.receive, refused.send)
    assert refused.status == 401 and "API key" in refused.body["error"]
    assert dict(refused.sent[0]["headers"])[b"www-authenticate"] == b"Bearer"
    allowed = Client([b"{}"], {b"authorization": b"Bearer sekrit"})
    await middleware(allowed.scope("/generate"), allowed.receive, allowed.send)
    assert allowed.status == 200
    probe = Client([b""])
    await middleware(probe.scope("/readyz"), probe.receive, probe.send)
    assert probe.status == 200


async def test_the_api_runs_in_the_request_task_and_streams_under_asgi_2_4() -> None:
    """No task start on the way to the API (each waits a turn of a busy loop), and spec 2.4 so
    that Starlette streams inline too: its `send` raises OSError once the client is gone."""
    seen: dict[str, Any] = {}
    client = Client([b"{}"])

    async def api(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        await receive()
        seen["task"] = asyncio.current_task()
        seen["spec"] = scope["asgi"]["spec_version"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        client.leave.set()  # the client goes while the stream runs
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            try:
                await send({"type": "http.response.body", "body": b"late", "more_body": True})
            except OSError:
                seen["late_send"] = "refused"
            raise

    async def request() -> asyncio.Task[Any] | None:
        await guard(api)(client.scope("/generate"), client.receive, client.send)
        return asyncio.current_task()

    task = asyncio.ensure_future(request())
    assert await asyncio.wait_for(task, 5) is seen["task"]
    assert seen["spec"] == "2.4" and seen["late_send"] == "refused"
    assert [m["type"] for m in client.sent] == ["http.response.start"]
    cancelling = getattr(task, "cancelling", None)
    assert cancelling is None or cancelling() == 0, "the watcher's cancellation is taken back"
