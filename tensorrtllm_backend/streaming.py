"""Coalesce streamed pieces when the HTTP side falls behind.

Every HTTP body message costs the same middleware work (access log, timeout, tracing) however
small it is. The engine side reads Triton's stream in its own task; the HTTP side takes whatever
has piled up since its last write and sends it as one message. A client that keeps up still gets
one message per piece; under load the pieces merge, and no piece is dropped or reordered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _End:
    __slots__ = ("error",)

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class _Pump(Generic[T]):
    def __init__(self, source: AsyncIterator[T]) -> None:
        self.source = source
        self.queue: asyncio.Queue[T | _End] = asyncio.Queue()
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            async for item in self.source:
                self.queue.put_nowait(item)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # handed to the consumer, raised there
            self.queue.put_nowait(_End(error))
            return
        self.queue.put_nowait(_End())

    async def close(self) -> None:
        if not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        aclose = getattr(self.source, "aclose", None)
        if aclose is not None:
            await aclose()


async def coalesce(source: AsyncIterator[T], merge: Callable[[list[T]], T]) -> AsyncIterator[T]:
    """Yield `merge(pieces)` of everything that arrived since the previous yield."""
    pump = _Pump(source)
    try:
        while True:
            pieces = [await pump.queue.get()]
            while not pump.queue.empty():
                pieces.append(pump.queue.get_nowait())
            end = pieces[-1] if isinstance(pieces[-1], _End) else None
            data = [p for p in pieces if not isinstance(p, _End)]
            if data:
                yield merge(data)  # type: ignore[arg-type]
            if end is not None:
                if end.error is not None:
                    raise end.error
                return
    finally:
        await pump.close()


def join_text(pieces: list[str]) -> str:
    return "".join(pieces)
