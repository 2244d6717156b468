"""Waiting on a condition with a deadline, for tests that watch state another thread or process
changes: never a fixed sleep followed by an assertion."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float, interval: float = 0.05) -> T:
    """Poll `condition` until it returns a truthy value or `timeout` seconds have passed; return
    its last value (falsy when the deadline passed), for the caller to assert on."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


async def wait_for_async(
    condition: Callable[[], T | Awaitable[T]], timeout: float, interval: float = 0.05
) -> T:
    """:func:`wait_for` inside an event loop: `condition` may be a coroutine function, and the
    wait between polls lets the loop run."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if isinstance(value, Awaitable):
            value = await value
        if value or time.monotonic() >= deadline:
            return value  # type: ignore[return-value]
        await asyncio.sleep(interval)
