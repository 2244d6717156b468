"""Restart a tritonserver that stopped answering while requests wait on it.

A process can be alive and still wedged: a crashed Python stub can leave the engine blocked on
sending a response (seen with tritonserver 2.51's Python backend), and then every stream waits
forever without an error. The supervisor only sees processes exit; this sees progress stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass
class StallWatchdog:
    """Calls `on_stall(seconds, open streams)` when streams are open but no response has arrived
    for `stall_s`.

    `progress()` returns (open streams, responses received so far). Any response from any
    stream counts as progress, so one long prefill among running streams is not a stall.
    """

    progress: Callable[[], tuple[int, int]]
    on_stall: Callable[[float, int], Awaitable[None]]
    stall_s: float
    interval_s: float = 1.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last_count = -1
        since = loop.time()
        while True:
            await asyncio.sleep(self.interval_s)
            open_streams, count = self.progress()
            now = loop.time()
            if not open_streams or count != last_count:
                last_count, since = count, now
                continue
            if now - since >= self.stall_s:
                await self.on_stall(now - since, open_streams)
                last_count, since = -1, loop.time()
