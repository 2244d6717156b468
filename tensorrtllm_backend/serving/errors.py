"""The one error mapper of every API: what went wrong → status, message, Retry-After → the
error body of the API (native, OpenAI or Anthropic, :mod:`.apis`).

- A client's mistake is a 4xx whose message says what to fix: :class:`RequestError` (400, 404,
  413, 422, naming the field), a body that fails a pydantic schema (400), a request nested too
  deeply to parse (400), a request the model server refuses as invalid (400).
- A failure of the model server is a 5xx: it refused the request for a reason of its own (502),
  did not answer in time (504), is down, restarting or full (503 + Retry-After: a retry can
  succeed). Only the answers a retry can change carry Retry-After (429 and 503), all with the
  same :data:`RETRY_AFTER_S`.
- Anything else is a bug of the service: 500 with a request id, logged once with its traceback.

Native APIs answer `{"error": "<what to fix>"}`, `/v1` OpenAI's error object (`/v1/messages`
Anthropic's, `{"type": "error", "error": {...}}`). `/generate_text`
and `/v1` return the response themselves. `/generate` is a stream, so it can only raise before
its first chunk (:class:`APIError`), and BentoML renders what it raises in its own way (a 4xx body
as a JSON list, a 5xx with its message replaced by "unexpected error"): :class:`NativeErrorMiddleware`
sends the mapper's body instead. A request body that fails the native schema is answered by
BentoML itself, titled with its internal class name ("1 validation error for
GenerateRequestIODescriptor"); the middleware words that as "max_tokens: Input should be a valid
integer" and keeps BentoML's per-field `detail` beside it.
"""

from __future__ import annotations

import json
import logging
import re
from contextvars import ContextVar
from dataclasses import dataclass
from http import HTTPStatus

from bentoml.exceptions import BentoMLException
from pydantic import ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..common.engine_api import (
    EngineModelError,
    EngineRequestError,
    EngineTimeoutError,
    EngineUnavailableError,
)
from ..common.guides import GuideBusyError
from .apis import API, ErrorStyle, api_for
from .ids import new_request_id
from .metrics import generation_metrics
from .request_errors import RequestError

RETRY_AFTER_S = 2
MAX_VALIDATION_BODY = 256 * 1024  # BentoML's validation answers are small; larger: passed as is

logger = logging.getLogger("bentoml.trtllm.errors")

_KINDS = {401: "authentication_error", 429: "rate_limit_error"}
# Anthropic's error types by status (its API answers 529 when overloaded; 503 here).
_ANTHROPIC_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
_DICT_WORDS = re.compile(r"a valid dictionary( or instance of \w+)?")


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """What an API answers for an error, whatever its body looks like."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None  # OpenAI's machine-readable code (e.g. context_length_exceeded)
    kind: str | None = None  # OpenAI's error type; None: from the status

    @property
    def retry(self) -> bool:
        """Whether a retry of the same request can succeed (429, 503): sent with Retry-After."""
        return self.status in (429, 503)

    @property
    def error_type(self) -> str:
        if self.kind is not None:
            return self.kind
        if self.status >= 500:
            return "server_error"
        return _KINDS.get(self.status, "invalid_request_error")


def validation_message(error: ValidationError) -> tuple[str, str | None]:
    """The first problem of a pydantic error as "field.path: what is wrong", and the field."""
    first = error.errors(include_url=False)[0]
    location = ".".join(str(part) for part in first.get("loc", ()))
    message = str(first.get("msg"))
    if first.get("type") == "json_invalid":
        message = f"the request body is not valid JSON ({first.get('ctx', {}).get('error', '')})"
        return message.replace(" ()", ""), None
    # Python's words for JSON's: what is parsed from JSON first reads as "dictionary" otherwise.
    message = _DICT_WORDS.sub("an object", message)
    return (f"{location}: {message}" if location else message), location or None


def answer_for(error: BaseException, request_id: str | None = None) -> ErrorAnswer:
    """The answer to `error`. An unexpected error is logged here, once, with its traceback."""
    if isinstance(error, RequestError):
        return ErrorAnswer(
            error.status,
            str(error),
            error.param,
            getattr(error, "code", None),
            getattr(error, "kind", None),
        )
    if isinstance(error, ValidationError):
        message, param = validation_message(error)
        return ErrorAnswer(400, message, param)
    if isinstance(error, RecursionError):
        return ErrorAnswer(400, "the request is nested too deeply: flatten it")
    if isinstance(error, EngineRequestError):
        return ErrorAnswer(400, f"the model refused the request: {error}")
    if isinstance(error, EngineUnavailableError):
        return ErrorAnswer(503, f"the model server is not available, retry shortly: {error}")
    if isinstance(error, GuideBusyError):
        return ErrorAnswer(503, str(error), "guided_decoding")
    if isinstance(error, EngineTimeoutError):
        return ErrorAnswer(504, f"the model server did not answer in time: {error}")
    if isinstance(error, EngineModelError):
        return ErrorAnswer(502, f"the model failed on this request: {error}")
    request_id = request_id or new_request_id()
    logger.error(
        "request %s failed unexpectedly: %s: %s",
        request_id, type(error).__name__, error, exc_info=error,
    )  # fmt: skip
    return ErrorAnswer(
        500, f"internal error (request id {request_id}); the server's log has the details"
    )


def render(answer: ErrorAnswer, style: ErrorStyle) -> JSONResponse:
    """The error body of an API of the given style, with Retry-After where a retry can help."""
    body: object
    if style is ErrorStyle.OPENAI:
        body = {
            "error": {
                "message": answer.message,
                "type": answer.error_type,
                "param": answer.param,
                "code": answer.code,
            }
        }
    elif style is ErrorStyle.ANTHROPIC:
        kind = _ANTHROPIC_KINDS.get(answer.status, "api_error" if answer.status >= 500 else None)
        body = {"type": "error", "error": {"type": kind or "invalid_request_error",
                                           "message": answer.message}}  # fmt: skip
    else:
        body = {"error": answer.message}
    headers = {"Retry-After": str(RETRY_AFTER_S)} if answer.retry else None
    return JSONResponse(body, status_code=answer.status, headers=headers)


def error_response(
    error: BaseException, api: API | str, request_id: str | None = None
) -> JSONResponse:
    """The response of an API (an entry of the registry, or its path) to `error`; a rejected
    request of a generation API is counted in the metrics."""
    if isinstance(api, str):
        api = api_for(api)
    answer = answer_for(error, request_id)
    _count_rejected(answer, api)
    return render(answer, api.errors)


def _count_rejected(answer: ErrorAnswer, api: API) -> None:
    if api.metrics_label is not None and 400 <= answer.status < 500:
        generation_metrics().record_rejected(api.metrics_label, "invalid_request")


class StreamAborted(BaseException):
    """Raised inside a started text stream: not an Exception, so frameworks that end a stream
    cleanly on errors let it through and the server aborts the connection."""


class APIError(BentoMLException):
    """Raised from streaming APIs before their first chunk: BentoML turns it into the status,
    and :class:`NativeErrorMiddleware` sends :attr:`answer` as the body."""

    def __init__(self, answer: ErrorAnswer, logged: bool = False) -> None:
        super().__init__(answer.message, error_code=HTTPStatus(answer.status))
        self.answer = answer
        self.logged = logged  # an unexpected error, logged with its traceback already

    @property
    def status(self) -> int:
        return int(self.error_code)


# Set by NativeErrorMiddleware for one request: the APIError the API raised, if any. A mutable
# holder, so that it is seen even if the API runs in a task with a copy of the context.
_raised: ContextVar[list[APIError] | None] = ContextVar("trtllm_native_error", default=None)


def as_api_error(error: BaseException, api: API | str, request_id: str | None = None) -> APIError:
    """The APIError a streaming native API raises for `error` before its first chunk."""
    if isinstance(api, str):
        api = api_for(api)
    answer = answer_for(error, request_id)
    _count_rejected(answer, api)
    api_error = APIError(answer, logged=answer.status == 500)
    raised = _raised.get()
    if raised is not None:
        raised.append(api_error)
    return api_error


class BriefAPIErrorLog(logging.Filter):
    """BentoML logs what a streaming API raises with its traceback, at ERROR, whatever the
    status: a traceback per bad request, and hundreds a second while tritonserver restarts. An
    APIError is an answer the mapper chose (and an unexpected one was logged with its traceback
    there already), and a request body that fails validation is the client's mistake, so each is
    logged as one line: WARNING for 4xx, ERROR for 5xx; an unexpected error not again."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, APIError):
            if error.logged:
                return False
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
    """For the native APIs (the registry's native-style entries): when a streaming API raised an
    :class:`APIError`, send :func:`render` of it in place of BentoML's rendering (same status);
    reword BentoML's schema-validation 400s (:func:`plain_validation_error`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api = api_for(scope.get("path", "")) if scope["type"] == "http" else None
        if api is None or api.open or api.errors is not ErrorStyle.NATIVE:
            await self.app(scope, receive, send)
            return
        if api.streams:
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
                    await render(error.answer, ErrorStyle.NATIVE)(scope, receive, send)
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
