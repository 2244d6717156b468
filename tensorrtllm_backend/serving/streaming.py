"""Coalesce streamed pieces when the HTTP side falls behind.

Every HTTP body message costs the same middleware work (access log, timeout, tracing) however
small it is. The engine side reads Triton's stream in its own task; the HTTP side takes whatever
has piled up since its last write and sends it as one message. A client that keeps up still gets
one message per piece; under load the pieces merge, and no piece is dropped or reordered.

A stream interval N > 1 (TRTLLM_STREAM_INTERVAL, like vLLM's --stream-interval) also makes every
message after the first wait for N pieces, or the end: about N times fewer HTTP messages per token,
for a burstier stream. The first piece always goes out at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class _End:
    __slots__ = ("error",)

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class _Pump(Generic[T]):
    """Reads the source in its own task into a deque; one future wakes the consumer.

    (An asyncio.Queue does the same with more bookkeeping per item, and this runs per token.)
    """

    def __init__(self, source: AsyncIterator[T]) -> None:
        self.source = source
        self.pending: deque[T | _End] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._wanted = 1
        self.task = asyncio.ensure_future(self._run())

    def _put(self, item: T | _End) -> None:
        self.pending.append(item)
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if len(self.pending) >= self._wanted or isinstance(item, _End):
            waiter.set_result(None)

    async def _run(self) -> None:
        try:
            async for item in self.source:
                self._put(item)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # handed to the consumer, raised there
            self._put(_End(error))
            return
        self._put(_End())

    async def take(self, at_least: int = 1) -> list[T | _End]:
        """Everything read since the last call, once that is `at_least` items or the end."""
        pending = self.pending
        if len(pending) < at_least and not (pending and isinstance(pending[-1], _End)):
            self._wanted = at_least
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items = list(self.pending)
        self.pending.clear()
        return items

    async def close(self) -> None:
        if not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await _close(self.source)


async def coalesce(
    source: AsyncIterator[T], merge: Callable[[list[T]], T], interval: int = 1
) -> AsyncIterator[T]:
    """Yield `merge(pieces)` of everything that arrived since the previous yield; after the
    first, at least `interval` pieces each (the last one may have fewer).

    The first piece is read in the caller's own task. Starting the reader task and handing the
    piece back would cost two event-loop turns before the first byte, and on a busy loop those
    turns are a large part of the time to first token (docs/streaming-path.md, "The first piece,
    read inline").
    """
    pump: _Pump[T] | None = None
    try:
        try:
            first = await anext(source)
        except StopAsyncIteration:
            return
        yield merge([first])
        pump = _Pump(source)
        while True:
            pieces = await pump.take(interval)
            end = pieces[-1] if isinstance(pieces[-1], _End) else None
            data = pieces[:-1] if end is not None else pieces
            if data:
                yield merge(data)  # type: ignore[arg-type]
            if end is not None:
                if end.error is not None:
                    raise end.error
                return
    finally:
        if pump is not None:
            await pump.close()
        else:
            await _close(source)


async def _close(source: AsyncIterator[Any]) -> None:
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        await aclose()


def join_text(pieces: list[str]) -> str:
    return "".join(pieces)
