"""The prefix cache's bookkeeping: hash chains, the longest held run, least-recently-used leaves
evicted first, and every change reported as a KV-cache event in order."""

from __future__ import annotations

from tensorrtllm_backend.python_models.cpu_engine.block_cache import BlockTable, chain_hashes
from tensorrtllm_backend.python_models.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
)


def test_a_block_hash_covers_its_prefix_and_the_extra_identity() -> None:
    a = chain_hashes(list(range(10)), 4)
    assert len(a) == 2  # full blocks only
    assert chain_hashes(list(range(8)), 4) == a  # the partial block changes nothing
    assert chain_hashes([99, *range(1, 10)], 4)[1] != a[1]  # an earlier token changes the chain
    assert chain_hashes(list(range(10)), 4, extra=b"image")[0] != a[0]
    assert all(0 <= value < 2**63 for value in a)


def test_the_longest_held_run_is_reused() -> None:
    events: list = []
    table = BlockTable(4, 8, events.extend)
    tokens = list(range(12))
    hashes = chain_hashes(tokens, 4)
    assert events == [AllBlocksCleared()]
    new = table.store(hashes[:2], tokens)
    assert [position for position, _ in new] == [0, 1]
    assert events[1] == BlockStored(hashes[:2], None, tokens[:8], 4)
    assert table.match(hashes) == [block_id for _, block_id in new]
    # A chain that shares the first block stores only what it adds, after its parent.
    other = [*tokens[:4], 50, 51, 52, 53]
    other_hashes = chain_hashes(other, 4)
    assert other_hashes[0] == hashes[0]
    assert [position for position, _ in table.store(other_hashes, other)] == [1]
    assert events[2] == BlockStored([other_hashes[1]], hashes[0], [50, 51, 52, 53], 4)


def test_least_recently_used_leaves_go_first_and_are_reported() -> None:
    events: list = []
    table = BlockTable(2, 3, events.extend)
    first = [1, 2, 3, 4]  # two blocks: a parent and its leaf
    second = [9, 9]
    first_hashes, second_hashes = chain_hashes(first, 2), chain_hashes(second, 2)
    table.store(first_hashes, first)
    table.store(second_hashes, second)
    table.match(second_hashes)  # `second` is now the most recently used
    third = [7, 7]
    table.store(chain_hashes(third, 2), third)
    # The full table had to evict: the least recently used leaf, never a parent of a held block.
    assert events[-1] == BlockStored(chain_hashes(third, 2), None, third, 2)
    assert events[-2] == BlockRemoved([first_hashes[1]])
    assert table.held() == {first_hashes[0], second_hashes[0], chain_hashes(third, 2)[0]}
    assert table.match(first_hashes) == table.match(first_hashes[:1])


def test_a_chain_never_evicts_its_own_blocks() -> None:
    table = BlockTable(1, 2)
    tokens = [1, 2, 3]
    new = table.store(chain_hashes(tokens, 1), tokens)
    assert [position for position, _ in new] == [0, 1]  # the third had no room: stop there
    assert len(table) == 2


def test_a_subscriber_rebuilds_what_the_cache_holds_from_its_events(monkeypatch) -> None:
    """A prefix cache with TRTLLM_KV_EVENTS_ENDPOINT set publishes every change in vLLM's wire
    format; a pyzmq subscriber that applies them (stored adds, removed drops, cleared empties)
    holds exactly the cache's blocks after a workload with evictions."""
    import random

    from kv_event_subscriber import BlockIndex, free_endpoint

    from tensorrtllm_backend.python_models.cpu_engine.loading import prefix_cache
    from tests.waiting import wait_for

    endpoint = free_endpoint()
    monkeypatch.setenv("TRTLLM_KV_EVENTS_ENDPOINT", endpoint)
    with BlockIndex(endpoint, block_size=4) as index:
        cache = prefix_cache(block_size=4, max_tokens=40)  # 10 blocks: the workload evicts
        try:
            events = cache.events
            assert events is not None
            # The cache is empty still: a "cleared" changes nothing.
            assert wait_for(lambda: index.heard(lambda: events.publish([AllBlocksCleared()])), 10)
            rng = random.Random(3)
            prefixes = [[rng.randrange(100) for _ in range(12)] for _ in range(4)]
            for _ in range(60):
                tokens = rng.choice(prefixes) + [
                    rng.randrange(100) for _ in range(rng.randrange(9))
                ]
                hashes = chain_hashes(tokens, 4)
                cache.table.match(hashes)
                cache.table.store(hashes, tokens)
            assert cache.table.held(), "the workload stored nothing"
            assert wait_for(lambda: index.drain() == cache.table.held(), 10), (
                index.held,
                cache.table.held(),
            )
        finally:
            cache.close()
