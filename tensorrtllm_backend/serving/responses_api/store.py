"""Stored responses of the Responses API: what `previous_response_id`, `GET`, `DELETE` and
`cancel` find, bounded in memory.

Each entry keeps the response as answered plus the conversation items it added (its input and its
output) and the id of the response it followed; a conversation is rebuilt by walking those links,
so a chain of N responses is stored once, not N times. Two limits bound the memory
(TRTLLM_RESPONSES_STORE_BYTES, TRTLLM_RESPONSES_STORE_TTL_S): the oldest responses leave once
the total size (their JSON) passes the byte budget, and every response leaves when it is older
than the age limit; both cost O(1) per request, the entries being kept in the order they were
stored. A budget of 0 stores nothing. The store lives in one worker's
memory: with several workers (TRTLLM_WORKERS) a response is found only on the worker that made it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...settings import load_settings


@dataclass
class StoredResponse:
    """One response and what it added to its conversation."""

    response: dict[str, Any]  # the Response object (its status follows a response in flight)
    items: list[dict[str, Any]]  # its input items, then its output items
    previous_id: str | None = None
    size: int = 0
    created: float = field(default_factory=time.monotonic)
    # Set while the response is generated: cancel() sets it, the generation stops.
    cancelled: asyncio.Event | None = None


class ResponseStore:
    """Responses by id, oldest first out, none older than `ttl_s`."""

    def __init__(
        self,
        max_bytes: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    @classmethod
    def from_settings(cls) -> ResponseStore:
        settings = load_settings()
        return cls(settings.responses_store_bytes, settings.responses_store_ttl_s)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        """Store (or replace) a response; older ones leave while the budget is exceeded. A
        response larger than the whole budget is not stored."""
        if not self.enabled:
            return
        self.delete(response_id)
        entry.size = len(json.dumps([entry.response, entry.items], separators=(",", ":")))
        entry.created = self._clock()
        if entry.size > self.max_bytes:
            return
        self._entries[response_id] = entry
        self._bytes += entry.size
        while self._bytes > self.max_bytes:
            _, oldest = self._entries.popitem(last=False)
            self._bytes -= oldest.size

    def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True

    def conversation(self, response_id: str) -> list[dict[str, Any]] | None:
        """Every item of the conversation up to and including the response, oldest first;
        None when the response, or one it followed, is no longer stored."""
        chain: list[StoredResponse] = []
        current: str | None = response_id
        seen: set[str] = set()
        while current is not None and current not in seen:
            seen.add(current)
            entry = self.get(current)
            if entry is None:
                return None
            chain.append(entry)
            current = entry.previous_id
        return [item for entry in reversed(chain) for item in entry.items]

    def _expire(self) -> None:
        if self.ttl_s <= 0:
            return
        horizon = self._clock() - self.ttl_s
        while self._entries:
            response_id, oldest = next(iter(self._entries.items()))
            if oldest.created >= horizon:
                return
            self.delete(response_id)
