"""Per-request detokenizer state for the ensemble's postprocessing model.

The ensemble calls postprocessing once per streamed response with only the new tokens, and
stateless decoding loses multi-byte characters and leading spaces at chunk borders. Triton passes
the client's request id to every composing model of an ensemble (checked with tritonserver 2.51),
but not the end of the stream: so state is keyed by request id and bounded instead of released
(least recently used entries beyond a maximum are dropped, and so are entries idle for longer
than a timeout).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from tensorrtllm_backend.common.tokenization import IncrementalDetokenizer


class DetokenizerCache:
    """LRU + idle-expiry map from a stream key to its IncrementalDetokenizer."""

    def __init__(
        self,
        factory: Callable[[], IncrementalDetokenizer],
        max_entries: int = 4096,
        idle_seconds: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self._factory = factory
        self._max_entries = max_entries
        self._idle_seconds = idle_seconds
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[float, IncrementalDetokenizer]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> IncrementalDetokenizer:
        """The detokenizer of a stream; a fresh one for a new (or expired) key."""
        now = self._clock()
        self._expire(now)
        entry = self._entries.pop(key, None)
        detokenizer = entry[1] if entry is not None else self._factory()
        self._entries[key] = (now, detokenizer)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return detokenizer

    def _expire(self, now: float) -> None:
        # Entries are ordered by last use, so the idle ones are at the front.
        while self._entries:
            last_used, _ = next(iter(self._entries.values()))
            if now - last_used <= self._idle_seconds:
                break
            self._entries.popitem(last=False)
