"""Map the core's exceptions to HTTP answers for the native API (the OpenAI adapter has its own
error objects). Bad input is a 4xx that says what to fix; Triton being away is a 503."""

from __future__ import annotations

from http import HTTPStatus

from bentoml.exceptions import BentoMLException
from starlette.responses import JSONResponse

from .client import TritonModelError, TritonUnavailableError
from .generation import RequestError
from .metrics import generation_metrics

RETRY_AFTER_S = 5


class StreamAborted(BaseException):
    """Raised inside a started text stream: not an Exception, so frameworks that end a stream
    cleanly on errors let it through and the server aborts the connection."""


class APIError(BentoMLException):
    """Raised from streaming APIs before their first chunk: BentoML turns it into the status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message, error_code=HTTPStatus(status))


def as_api_error(error: Exception) -> APIError:
    if isinstance(error, RequestError):
        generation_metrics().record_rejected("native", "invalid_request")
        return APIError(str(error), error.status)
    if isinstance(error, TritonUnavailableError):
        return APIError(f"the model server is not available, retry shortly: {error}", 503)
    if isinstance(error, TritonModelError):
        return APIError(f"the model failed on this request: {error}", 502)
    raise error


def error_response(error: Exception) -> JSONResponse:
    """A JSON error body for coroutine APIs, which can return a response of their own."""
    api_error = as_api_error(error)
    status = int(api_error.error_code)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None
    return JSONResponse({"error": str(api_error)}, status_code=status, headers=headers)
