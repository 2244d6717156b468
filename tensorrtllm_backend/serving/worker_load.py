"""Generations in flight per HTTP worker, and when a worker lets a keep-alive connection go so
that the service's load spreads evenly over its workers (TRTLLM_WORKERS > 1).

The workers accept connections from one listening socket, and a keep-alive client (a proxy's
connection pool, the OpenAI SDK, a load generator) sends every later request on the connections
it opened first. Which worker accepted each of them stays as it happened: 40, 36, 36 and 20 of a
client's 128 connections in one measurement. Every stream then waits for its worker's event loop,
and the busiest worker sets the latency of its share of the traffic.

So each worker publishes the generations it runs in a file that all workers of the service map
(in TRTLLM_SHARED_DIR), and a worker above its fair share answers a request with
``Connection: close``. The client opens a new connection for its next request, and the worker
that accepts it is the first to call `accept`: one that waits in its event loop, not one busy
with its streams. A worker's generations on connections it is letting go still count in the
share, but not in what it keeps, so it lets go only what it keeps above its share, not every
connection it holds. On the GPU host this took four workers' TTFT p50 from +5.5..+10.6 ms over a
bare gRPC client to +2.0..+4.9 (docs/results/runs/2026-11-27-gpu-host-h200-workers-sharing-the-load.md).
"""

from __future__ import annotations

import logging
import mmap
import os
from functools import cache
from pathlib import Path
from typing import Any

from bentoml._internal.context import server_context

from ..settings import Settings

logger = logging.getLogger(__name__)

BOARD_NAME = "generations-in-flight"
SLOT_FORMAT = "q"  # one int64 per worker: aligned 8-byte stores are single writes
SLOT_BYTES = 8


class LoadBoard:
    """One worker's view of the board: its own slot to write, everyone's to read."""

    def __init__(self, path: Path, workers: int, index: int) -> None:
        if not 0 <= index < workers:
            raise ValueError(f"worker index {index} outside 0..{workers - 1}")
        size = workers * SLOT_BYTES
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # the same size from every worker: a race is harmless
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._slots = memoryview(self._map).cast(SLOT_FORMAT)
        self.workers = workers
        self.index = index
        # Connections this worker is letting go whose response has not ended yet.
        self.releasing = 0
        self._slots[index] = 0  # a worker that replaces a dead one starts from nothing

    def admit(self, in_flight: int) -> bool:
        """A generation starts, `in_flight` with it: whether its connection is to close after
        the answer (counted in /metrics)."""
        release = self.over_share(in_flight)
        if release:
            self.releasing += 1
            _released_counter().inc()
        self.publish(in_flight)
        return release

    def leave(self, in_flight: int, released: bool) -> None:
        """A generation ended, `in_flight` left; `released`: what :meth:`admit` said of it."""
        self.releasing -= released
        self.publish(in_flight)

    def publish(self, in_flight: int) -> None:
        """This worker runs `in_flight` generations."""
        self._slots[self.index] = in_flight

    def loads(self) -> list[int]:
        return self._slots.tolist()

    def over_share(self, in_flight: int) -> bool:
        """Whether this worker, running `in_flight` generations, keeps more than its share.

        The share is the mean over the workers of all generations in flight, those on
        connections being let go included (their clients come back, to some worker). What a
        worker keeps leaves those out. The margin, one generation or an eighth of the share,
        whichever is more, keeps the coming and going of requests from moving connections
        around.
        """
        others = sum(self._slots) - self._slots[self.index]
        share = (in_flight + others) / self.workers
        return in_flight - self.releasing > share + max(1.0, share / 8)


@cache
def _released_counter() -> Any:
    """Created on first use, in the worker: BentoML turns on prometheus_client's multiprocess
    mode when the worker starts, after service.py is imported."""
    import prometheus_client as prom

    return prom.Counter(
        "trtllm_connections_released",
        "Keep-alive connections a worker closed after their answer because it ran more than its "
        "share of the generations.",
    )


@cache
def worker_board(shared_dir: Path, workers: int, worker_index: int) -> LoadBoard:
    """This process's slot on its service's board: one per process, whoever asks."""
    return LoadBoard(shared_dir / BOARD_NAME, workers, worker_index)


def board_for(settings: Settings) -> LoadBoard | None:
    """The board of this worker when the service has several and rebalances their connections;
    None otherwise (one worker, a test's app, rebalancing turned off)."""
    if settings.workers <= 1 or not settings.rebalance_connections:
        return None
    if settings.shared_dir is None:
        return None
    # BentoML numbers its workers from 1 (circus's WID); a respawned worker gets the number of
    # the one it replaces.
    index = server_context.worker_index
    if index is None:
        return None
    try:
        return worker_board(settings.shared_dir, settings.workers, (index - 1) % settings.workers)
    except OSError as error:  # the worker serves all the same, without rebalancing
        logger.warning("cannot share this worker's load in %s: %s", settings.shared_dir, error)
        return None
