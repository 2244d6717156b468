"""log_server_errors_once: BentoML 1.4 printed every uvicorn server error twice (its own handler,
then the root's identical one); the fix applies only in exactly that configuration."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tensorrtllm_backend.deployment import log_server_errors_once


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
