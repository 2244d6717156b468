"""Work whose cost grows with the request (tokenizing a prompt, rendering a chat template,
loading LoRA weights) runs off the event loop, in a small thread pool of the service's own.

The loop carries every stream's tokens; a megabyte prompt tokenized on it stopped every stream of
the worker for over a second. The pool is the service's, not asyncio's default executor (which
the readiness probe and BentoML use), and bounded: the work is CPU-bound, so more threads than
cores only queue it differently. Tokenizers and xgrammar release the GIL while they work; pure
Python work (jinja2) shares it with the loop at the interpreter's switch interval (5 ms).

Small requests stay inline: a hop to a thread and back costs ~50 µs here, more than tokenizing a
short prompt. See :data:`INLINE_MAX_CHARS`.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

# Requests up to this size (characters of prompt, or bytes of body) are handled on the loop.
# Measured on the development machine (demo tokenizer, byte-level BPE): tokenizing costs
# ~0.3 µs per character (2,000 characters: 0.6 ms; 20,000: 7.6 ms), and a round trip through
# the pool ~50 µs (median; 60-120 µs at p90 under load). At 2 KiB, inline work blocks the loop
# for at most ~0.6 ms, and the hop above it costs under a tenth of the work it moves.
INLINE_MAX_CHARS = 2048

DEFAULT_THREADS = max(1, min(4, os.cpu_count() or 1))


class Offloader:
    """Runs a function inline or in the pool, by the size of the request it works on."""

    def __init__(self, threads: int = DEFAULT_THREADS) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="trtllm-request")

    async def run(
        self, size: int, function: Callable[P, R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """`function(*args, **kwargs)`: inline when `size` <= INLINE_MAX_CHARS, else in the
        pool (the caller awaits without blocking the loop)."""
        if size <= INLINE_MAX_CHARS:
            return function(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(function, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
