"""Several async iterators read as one: the items of a batch's prompts as they come."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TypeVar

T = TypeVar("T")
# Items read ahead per iterator at most: a slow reader (the client's connection) holds the
# engine streams back instead of buffering their answers.
READ_AHEAD = 16


class _End:
    """One iterator's end, with the error it ended on (None: it was exhausted)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


async def merged(iterators: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Every item of `iterators` as it arrives, with its iterator's position in the list. An
    iterator's error is raised here; leaving early (or an error) closes every iterator."""
    queue: asyncio.Queue[tuple[int, T | _End]] = asyncio.Queue(READ_AHEAD * len(iterators))

    async def pump(position: int, iterator: AsyncIterator[T]) -> None:
        try:
            async with aclosing(iterator) as each:  # type: ignore[type-var]
                async for item in each:
                    await queue.put((position, item))
        except Exception as error:
            await queue.put((position, _End(error)))
            return
        await queue.put((position, _End()))

    tasks = [asyncio.create_task(pump(i, iterator)) for i, iterator in enumerate(iterators)]
    try:
        running = len(tasks)
        while running:
            position, item = await queue.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                running -= 1
                continue
            yield position, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
