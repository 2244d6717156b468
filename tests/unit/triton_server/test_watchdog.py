"""StallWatchdog: a stall is open streams with no new response for stall_s; idle is not."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tensorrtllm_backend.triton.watchdog import StallWatchdog


class Progress:
    def __init__(self, open_streams: int = 0, responses: int = 0) -> None:
        self.open_streams = open_streams
        self.responses = responses
        self.stalls: list[float] = []

    def __call__(self) -> tuple[int, int]:
        return self.open_streams, self.responses

    async def on_stall(self, stalled_s: float, open_streams: int) -> None:
        assert open_streams == self.open_streams
        self.stalls.append(stalled_s)


async def run_for(
    progress: Progress,
    seconds: float,
    while_running: Callable[[], Awaitable[None]] | None = None,
) -> None:
    watchdog = StallWatchdog(progress, progress.on_stall, stall_s=0.1, interval_s=0.02)
    task = asyncio.ensure_future(watchdog.run())
    try:
        if while_running is not None:
            await while_running()
        else:
            await asyncio.sleep(seconds)
    finally:
        task.cancel()


async def test_open_streams_without_responses_are_a_stall() -> None:
    progress = Progress(open_streams=2)
    await run_for(progress, 0.3)
    assert progress.stalls and all(s >= 0.1 for s in progress.stalls)
    assert len(progress.stalls) <= 3  # measured again from scratch after each restart


async def test_an_idle_server_is_not_stalled() -> None:
    progress = Progress(open_streams=0, responses=7)
    await run_for(progress, 0.3)
    assert progress.stalls == []


async def test_responses_from_any_stream_are_progress() -> None:
    progress = Progress(open_streams=3)

    async def keep_answering() -> None:
        for _ in range(15):
            progress.responses += 1
            await asyncio.sleep(0.02)

    await run_for(progress, 0, keep_answering)
    assert progress.stalls == []
