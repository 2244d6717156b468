"""Map the core's exceptions to HTTP answers for the native API (the OpenAI adapter has its own
error objects). Bad input is a 4xx that says what to fix; Triton being away is a 503.

Both native APIs answer an error with `{"error": "<what to fix>"}` (plus Retry-After on 429 and
503). `/generate_text` returns that response itself. `/generate` is a stream, so it can only raise
before its first chunk, and BentoML renders what it raises in its own way: a 4xx body as a JSON
list, a 5xx with its message replaced by "unexpected error". :class:`NativeErrorMiddleware`
renders those errors like `/generate_text` does instead. A request body that fails the schema is
answered by BentoML itself, titled with its internal class name ("1 validation error for
GenerateRequestIODescriptor"); the middleware words that as "max_tokens: Input should be a valid
integer" and keeps BentoML's per-field `detail` beside it.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from http import HTTPStatus

from bentoml.exceptions import BentoMLException
from pydantic import ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..common.engine_api import EngineModelError, EngineUnavailableError
from .metrics import generation_metrics
from .request_errors import RequestError

RETRY_AFTER_S = 5
STREAMING_NATIVE_PATHS = frozenset({"/generate"})
NATIVE_PATHS = frozenset({"/generate", "/generate_text"})
MAX_VALIDATION_BODY = 256 * 1024  # BentoML's validation answers are small; larger: passed as is


class StreamAborted(BaseException):
    """Raised inside a started text stream: not an Exception, so frameworks that end a stream
    cleanly on errors let it through and the server aborts the connection."""


class APIError(BentoMLException):
    """Raised from streaming APIs before their first chunk: BentoML turns it into the status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message, error_code=HTTPStatus(status))

    @property
    def status(self) -> int:
        return int(self.error_code)


class BriefAPIErrorLog(logging.Filter):
    """BentoML logs what a streaming API raises with its traceback, at ERROR, whatever the
    status: a traceback per bad request, and hundreds a second while tritonserver restarts. An
    APIError is an answer we chose, and a request body that fails validation is the client's
    mistake, so each is logged as one line: WARNING for 4xx, ERROR for 5xx."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, APIError):
            status, text = error.status, str(error)
        elif isinstance(error, ValidationError):  # BentoML answers it with a 400
            status, text = 400, f"{error.error_count()} validation error(s) for {error.title}"
        else:
            return True
        record.msg, record.args = "%s: %d %s", (record.getMessage(), status, text)
        record.exc_info = record.exc_text = None
        if status < 500:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


# The logger of BentoML's HTTP app, which logs the exceptions of API functions.
BENTOML_API_LOGGER = "bentoml._internal.server.http_app"


def log_api_errors_briefly() -> None:
    api_logger = logging.getLogger(BENTOML_API_LOGGER)
    if not any(isinstance(f, BriefAPIErrorLog) for f in api_logger.filters):
        api_logger.addFilter(BriefAPIErrorLog())


# Set by NativeErrorMiddleware for one request: the APIError the API raised, if any. A mutable
# holder, so that it is seen even if the API runs in a task with a copy of the context.
_raised: ContextVar[list[APIError] | None] = ContextVar("trtllm_native_error", default=None)


def as_api_error(error: Exception) -> APIError:
    if isinstance(error, RequestError):
        generation_metrics().record_rejected("native", "invalid_request")
        api_error = APIError(str(error), error.status)
    elif isinstance(error, EngineUnavailableError):
        api_error = APIError(f"the model server is not available, retry shortly: {error}", 503)
    elif isinstance(error, EngineModelError):
        api_error = APIError(f"the model failed on this request: {error}", 502)
    else:
        raise error
    raised = _raised.get()
    if raised is not None:
        raised.append(api_error)
    return api_error


def json_error(api_error: APIError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if api_error.status in (429, 503) else None
    return JSONResponse({"error": str(api_error)}, status_code=api_error.status, headers=headers)


def error_response(error: Exception) -> JSONResponse:
    """A JSON error body for coroutine APIs, which can return a response of their own."""
    return json_error(as_api_error(error))


def _field(location: list[object]) -> str:
    """("guided_decoding", "type") -> guided_decoding.type; ("stop", 2) -> stop[2]."""
    name = ""
    for part in location:
        name += f"[{part}]" if isinstance(part, int) else f"{'.' if name else ''}{part}"
    return name or "body"


def plain_validation_error(body: object) -> dict[str, object] | None:
    """BentoML's 400 for a body that fails the schema, reworded for people; None if `body`
    is not one."""
    if not isinstance(body, dict) or "validation error" not in str(body.get("error", "")):
        return None
    detail = body.get("detail")
    if not isinstance(detail, list) or not all(isinstance(item, dict) for item in detail):
        return None
    lines = [
        f"{_field(list(item.get('loc') or []))}: {item.get('msg', 'invalid')}" for item in detail
    ]
    return {"error": "; ".join(lines), "detail": detail}


class NativeErrorMiddleware:
    """For the native APIs: when the streaming API raised an :class:`APIError`, send
    :func:`json_error` of it in place of BentoML's rendering (same status); reword BentoML's
    schema-validation 400s (:func:`plain_validation_error`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in NATIVE_PATHS:
            await self.app(scope, receive, send)
            return
        if scope.get("path") in STREAMING_NATIVE_PATHS:
            await self._streaming(scope, receive, send)
        else:
            await self.app(scope, receive, _ValidationRewording(send))

    async def _streaming(self, scope: Scope, receive: Receive, send: Send) -> None:
        send = _ValidationRewording(send)
        raised: list[APIError] = []
        token = _raised.set(raised)
        replaced = False

        async def send_rendered(message: Message) -> None:
            nonlocal replaced
            if replaced:
                return  # BentoML's own error body
            if message["type"] == "http.response.start" and raised:
                error = raised[-1]
                if message["status"] == error.status:
                    replaced = True
                    await json_error(error)(scope, receive, send)
                    return
            await send(message)

        try:
            await self.app(scope, receive, send_rendered)
        finally:
            _raised.reset(token)


class _ValidationRewording:
    """An ASGI `send` that holds back a 400 JSON answer, and sends it reworded when it is
    BentoML's schema-validation error (anything else is sent unchanged)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._start: Message | None = None
        self._body = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers") or [])
            if message["status"] == 400 and b"json" in headers.get(b"content-type", b""):
                self._start = message
                return
        elif message["type"] == "http.response.body" and self._start is not None:
            self._body += message.get("body", b"")
            if message.get("more_body") and len(self._body) <= MAX_VALIDATION_BODY:
                return
            await self._flush(bool(message.get("more_body")))
            return
        await self._send(message)

    async def _flush(self, more_body: bool) -> None:
        start, body, self._start, self._body = self._start, self._body, None, b""
        assert start is not None
        reworded = None
        if not more_body:
            try:
                reworded = plain_validation_error(json.loads(body))
            except ValueError:
                reworded = None
        if reworded is not None:
            body = json.dumps(reworded).encode()
            headers = [(k, v) for k, v in start.get("headers") or [] if k != b"content-length"]
            start = {**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        await self._send(start)
        await self._send({"type": "http.response.body", "body": body, "more_body": more_body})
