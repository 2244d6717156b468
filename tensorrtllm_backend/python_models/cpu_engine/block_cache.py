"""The prefix cache's bookkeeping: which KV-cache blocks are held, found by a hash chain.

As TensorRT-LLM's KV-cache reuse (and vLLM's prefix caching) does it: a prompt is cut into
blocks of `block_size` tokens; block i's hash covers its tokens, the hash of block i - 1 and the
request's extra identity (a LoRA adapter, images), so equal hashes mean equal prefixes. A request
reuses the longest run of its leading blocks the cache holds; a finished request's full blocks
are stored. The cache holds at most `max_blocks`; when full, the least recently used block that
no other held block extends is evicted first (a leaf: evicting a middle block would strand the
blocks after it).

Each change is reported as vLLM's KV-cache event (BlockStored, BlockRemoved, AllBlocksCleared)
to `on_events`, in order, so that a router can mirror what the engine holds. The tensors live
with the backend (hf.py); this module only knows block ids 0..max_blocks-1.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

ROOT_HASH = 0  # the parent of a prompt's first block


def chain_hashes(tokens: Sequence[int], block_size: int, extra: bytes = b"") -> list[int]:
    """The hashes of `tokens`' full blocks: 64-bit, sha256 over the parent's hash, the extra
    identity and the block's token ids (stable across processes, unlike Python's hash())."""
    hashes: list[int] = []
    parent = ROOT_HASH
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start : start + block_size]
        digest = hashlib.sha256(
            struct.pack(f"<QI{len(block)}q", parent, len(extra), *block) + extra
        ).digest()
        parent = int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF
        hashes.append(parent)
    return hashes


@dataclass(slots=True)
class _Block:
    block_id: int
    parent: int | None  # the parent block's hash (None: a first block)
    children: int = 0  # held blocks that extend this one


class BlockTable:
    """Which blocks are held, by hash, in least-recently-used order."""

    def __init__(
        self,
        block_size: int,
        max_blocks: int,
        on_events: Callable[[list[KvEvent]], object] | None = None,
    ) -> None:
        if block_size < 1 or max_blocks < 1:
            raise ValueError("block_size and max_blocks must be at least 1")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[int, _Block] = OrderedDict()  # hash -> block, LRU first
        self._free = list(range(max_blocks - 1, -1, -1))
        self._on_events = on_events
        self._emit([AllBlocksCleared()])

    def __len__(self) -> int:
        return len(self._blocks)

    def held(self) -> set[int]:
        return set(self._blocks)

    def match(self, hashes: Sequence[int]) -> list[int]:
        """The block ids of the longest run of `hashes` held from the first; each becomes the
        most recently used."""
        found = []
        for value in hashes:
            block = self._blocks.get(value)
            if block is None:
                break
            self._blocks.move_to_end(value)
            found.append(block.block_id)
        return found

    def reusable(self, prompt: Sequence[int], extra: bytes = b"") -> list[int]:
        """The block ids of `prompt`'s longest held prefix, its last token left out: that one is
        always computed (its logits give the first token). `extra`: the request's identity
        beyond its tokens (its images)."""
        return self.match(chain_hashes(prompt[:-1], self.block_size, extra))

    def keep(self, tokens: Sequence[int], extra: bytes = b"") -> list[tuple[int, int]]:
        """:meth:`store` the full blocks of `tokens` (`extra` as in :meth:`reusable`)."""
        return self.store(chain_hashes(tokens, self.block_size, extra), tokens)

    def store(self, hashes: Sequence[int], tokens: Sequence[int]) -> list[tuple[int, int]]:
        """Hold the chain `hashes` (of `tokens`' blocks): (position in the chain, block id) of
        each block newly allocated, whose contents the caller then writes. Blocks already held
        become the most recently used; allocation evicts least recently used leaves, never a
        block of this chain. Stops early when nothing can be evicted."""
        new: list[tuple[int, int]] = []
        stored_hashes: list[int] = []
        stored_tokens: list[int] = []
        first_parent: int | None = None
        removed: list[int] = []
        parent: int | None = None
        protect = set(hashes)  # this chain's held blocks are its parents
        for position, value in enumerate(hashes):
            held = self._blocks.get(value)
            if held is not None:
                self._blocks.move_to_end(value)
                parent = value
                continue
            block_id = self._allocate(removed, protect)
            if block_id is None:
                break
            self._blocks[value] = _Block(block_id, parent)
            if parent is not None:
                self._blocks[parent].children += 1
            if not stored_hashes:
                first_parent = parent
            elif stored_hashes[-1] != parent:  # a run that resumes after a held block
                self._emit_stored(stored_hashes, first_parent, stored_tokens, removed)
                removed, stored_hashes, stored_tokens, first_parent = [], [], [], parent
            stored_hashes.append(value)
            start = position * self.block_size
            stored_tokens.extend(tokens[start : start + self.block_size])
            new.append((position, block_id))
            parent = value
        self._emit_stored(stored_hashes, first_parent, stored_tokens, removed)
        return new

    def clear(self) -> None:
        self._blocks.clear()
        self._free = list(range(self.max_blocks - 1, -1, -1))
        self._emit([AllBlocksCleared()])

    # -- internals ----------------------------------------------------------------------------
    def _allocate(self, removed: list[int], protect: set[int]) -> int | None:
        if self._free:
            return self._free.pop()
        for value, block in self._blocks.items():  # least recently used first
            if block.children == 0 and value not in protect:
                del self._blocks[value]
                if block.parent is not None and block.parent in self._blocks:
                    self._blocks[block.parent].children -= 1
                removed.append(value)
                return block.block_id
        return None

    def _emit_stored(
        self, hashes: list[int], parent: int | None, tokens: list[int], removed: list[int]
    ) -> None:
        events: list[KvEvent] = []
        if removed:
            events.append(BlockRemoved(list(removed)))
        if hashes:
            events.append(BlockStored(list(hashes), parent, list(tokens), self.block_size))
        self._emit(events)

    def _emit(self, events: list[KvEvent]) -> None:
        if events and self._on_events is not None:
            self._on_events(events)
