"""StallWatchdog: a stall is open streams with no new response for stall_s; idle is not. The
tests wait on what the watchdog did (its looks at the progress, its stalls), never on time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tensorrtllm_backend.triton.watchdog import StallWatchdog
from tests.waiting import wait_for_async

STALL_S = 0.1
# Looks at the progress enough to span several stall periods (interval 0.02 s).
LOOKS = 20


class Progress:
    def __init__(self, open_streams: int = 0, responses: int = 0, answering: bool = False) -> None:
        self.open_streams = open_streams
        self.responses = responses
        self.answering = answering  # a new response before each look
        self.looks = 0
        self.stalls: list[tuple[float, float]] = []  # (when, stalled seconds)

    def __call__(self) -> tuple[int, int]:
        self.looks += 1
        if self.answering:
            self.responses += 1
        return self.open_streams, self.responses

    async def on_stall(self, stalled_s: float, open_streams: int) -> None:
        assert open_streams == self.open_streams
        self.stalls.append((asyncio.get_running_loop().time(), stalled_s))


@asynccontextmanager
async def watching(progress: Progress) -> AsyncIterator[None]:
    watchdog = StallWatchdog(progress, progress.on_stall, stall_s=STALL_S, interval_s=0.02)
    task = asyncio.ensure_future(watchdog.run())
    try:
        yield
    finally:
        task.cancel()


async def test_open_streams_without_responses_are_a_stall() -> None:
    progress = Progress(open_streams=2)
    async with watching(progress):
        assert await wait_for_async(lambda: len(progress.stalls) >= 2, 30), progress.stalls
    (first, first_s), (second, second_s) = progress.stalls[:2]
    assert first_s >= STALL_S and second_s >= STALL_S
    assert second - first >= STALL_S  # measured again from scratch after each restart


async def test_an_idle_server_is_not_stalled() -> None:
    progress = Progress(open_streams=0, responses=7)
    async with watching(progress):
        assert await wait_for_async(lambda: progress.looks >= LOOKS, 30)
    assert progress.stalls == []


async def test_responses_from_any_stream_are_progress() -> None:
    progress = Progress(open_streams=3, answering=True)
    async with watching(progress):
        assert await wait_for_async(lambda: progress.looks >= LOOKS, 30)
    assert progress.stalls == []
