"""log_server_errors_once: BentoML 1.4 printed every uvicorn server error twice (its own handler,
then the root's identical one); the fix applies only in exactly that configuration. And the
errors a streaming API raises on purpose are logged as one line each."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from tensorrtllm_backend.serving.deployment import log_server_errors_once
from tensorrtllm_backend.serving.errors import (
    BENTOML_API_LOGGER,
    APIError,
    BriefAPIErrorLog,
    ErrorAnswer,
    log_api_errors_briefly,
)
from tensorrtllm_backend.serving.schemas import GenerateRequest


@pytest.fixture
def loggers() -> Iterator[tuple[logging.Logger, logging.Logger]]:
    root, server_errors = logging.getLogger(), logging.getLogger("uvicorn.error")
    saved = (list(root.handlers), list(server_errors.handlers), server_errors.propagate)
    yield root, server_errors
    root.handlers[:], server_errors.handlers[:] = saved[0], saved[1]
    server_errors.propagate = saved[2]


def records_printed(server_errors: logging.Logger, handler: logging.Handler) -> int:
    printed: list[logging.LogRecord] = []
    handler.emit = printed.append  # type: ignore[method-assign]
    server_errors.error("Application startup failed. Exiting.")
    return len(printed)


def test_an_error_shared_by_both_handlers_is_printed_once(loggers) -> None:
    root, server_errors = loggers
    shared = logging.StreamHandler()
    root.handlers[:] = [shared]
    server_errors.handlers[:] = [shared]
    server_errors.propagate = True
    assert records_printed(server_errors, shared) == 2  # BentoML 1.4's configuration
    log_server_errors_once()
    assert server_errors.propagate is False
    assert records_printed(server_errors, shared) == 1


def test_other_configurations_are_left_alone(loggers) -> None:
    root, server_errors = loggers
    root.handlers[:] = [logging.StreamHandler()]
    server_errors.handlers[:] = []  # uvicorn.error printed by the root only
    server_errors.propagate = True
    log_server_errors_once()
    assert server_errors.propagate is True


def test_api_errors_are_logged_as_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """What /generate raises reaches BentoML's log as one line, not a traceback per request."""
    log_api_errors_briefly()
    log_api_errors_briefly()  # idempotent: one filter
    api_logger = logging.getLogger(BENTOML_API_LOGGER)
    assert sum(isinstance(f, BriefAPIErrorLog) for f in api_logger.filters) == 1
    caplog.set_level(logging.INFO, logger=BENTOML_API_LOGGER)
    for error in (
        APIError(ErrorAnswer(503, "the model server is not available, retry shortly: 100% gone")),
        APIError(ErrorAnswer(400, "max_tokens: must be at least 1")),
        RuntimeError("a bug"),
        APIError(ErrorAnswer(500, "internal error (request id 1f)"), logged=True),
    ):
        try:
            raise error
        except Exception:
            api_logger.error("Exception on %s [%s]", "/generate", "POST", exc_info=True)
    try:
        GenerateRequest.model_validate({"prompt": "hi", "max_tokens": "many"})
    except ValidationError:
        api_logger.error("Exception on %s [%s]", "/generate", "POST", exc_info=True)
    # the unexpected error's APIError is not logged again: the mapper logged its traceback
    unavailable, bad_request, bug, invalid = caplog.records
    assert unavailable.levelno == logging.ERROR and unavailable.exc_info is None
    assert unavailable.getMessage() == (
        "Exception on /generate [POST]: 503 the model server is not available, retry shortly: "
        "100% gone"
    )
    assert bad_request.levelno == logging.WARNING and bad_request.exc_info is None
    assert "400 max_tokens: must be at least 1" in bad_request.getMessage()
    assert bug.levelno == logging.ERROR and bug.exc_info is not None  # a real bug keeps its trace
    assert invalid.levelno == logging.WARNING and invalid.exc_info is None
    assert "400 1 validation error(s) for GenerateRequest" in invalid.getMessage()
