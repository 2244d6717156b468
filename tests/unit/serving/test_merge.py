"""Several async iterators read as one (a completion batch's prompts)."""

from __future__ import annotations

import asyncio

import pytest

from tensorrtllm_backend.serving.openai_api.merge import merged


async def items(name: str, count: int, delay: float, closed: list[str], fail_at: int = -1):
    try:
        for i in range(count):
            await asyncio.sleep(delay)
            if i == fail_at:
                raise RuntimeError(f"{name} failed")
            yield f"{name}{i}"
    finally:
        closed.append(name)


async def test_every_item_arrives_tagged_with_its_iterator() -> None:
    closed: list[str] = []
    got = [
        item async for item in merged([items("a", 3, 0.001, closed), items("b", 2, 0.0, closed)])
    ]
    assert sorted(got) == [(0, "a0"), (0, "a1"), (0, "a2"), (1, "b0"), (1, "b1")]
    assert [item for position, item in got if position == 0] == ["a0", "a1", "a2"]
    assert sorted(closed) == ["a", "b"]


async def test_an_error_in_one_ends_all_and_closes_the_others() -> None:
    closed: list[str] = []
    with pytest.raises(RuntimeError, match="b failed"):
        async for _ in merged([items("a", 100, 0.01, closed), items("b", 5, 0.0, closed, 2)]):
            pass
    assert sorted(closed) == ["a", "b"]


async def test_leaving_early_closes_every_iterator() -> None:
    closed: list[str] = []
    stream = merged([items("a", 100, 0.001, closed), items("b", 100, 0.001, closed)])
    async for _ in stream:
        break
    await stream.aclose()
    assert sorted(closed) == ["a", "b"]
