"""deployment.freeze_startup_heap: start-up objects leave the collector's walks, start-up
garbage is freed first (a frozen object is never freed)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from tensorrtllm_backend.serving.deployment import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_live_objects_are_frozen_and_garbage_is_freed(unfrozen: None) -> None:
    kept = _Node()
    garbage = _Node()
    garbage.other = _Node()
    garbage.other.other = garbage  # a cycle: only the collector frees it
    freed = weakref.ref(garbage)
    del garbage
    freeze_startup_heap()
    assert freed() is None
    assert gc.get_freeze_count() > 1000
    assert all(obj is not kept for obj in gc.get_objects())  # frozen: not in any generation
