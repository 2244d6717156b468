"""streaming.coalesce: every piece once and in order, merged only when the consumer is behind
(or by the stream interval); errors reach the consumer after the pieces before them; leaving early
stops the source."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tensorrtllm_backend.serving.streaming import coalesce, join_text
from tensorrtllm_backend.settings import load_settings


async def pieces(count: int, log: list[str], fail_after: int | None = None) -> AsyncIterator[str]:
    try:
        for index in range(count):
            await asyncio.sleep(0)  # one event-loop turn per piece, like a network read
            if fail_after is not None and index == fail_after:
                raise RuntimeError("stream broke")
            yield f"{index},"
    finally:
        log.append("source closed")


async def test_a_consumer_that_keeps_up_gets_one_message_per_piece() -> None:
    log: list[str] = []
    received = [text async for text in coalesce(pieces(5, log), join_text)]
    assert received == ["0,", "1,", "2,", "3,", "4,"]
    assert log == ["source closed"]


async def test_the_first_piece_costs_no_event_loop_turn() -> None:
    """Under load every turn of the event loop is a wait behind the other streams' tokens: the
    first piece must reach the consumer without starting a task or a hand-off."""

    async def ready_pieces() -> AsyncIterator[str]:
        yield "first,"
        await asyncio.sleep(0)
        yield "second,"

    turns = 0

    def count_turn() -> None:
        nonlocal turns
        turns += 1

    asyncio.get_running_loop().call_soon(count_turn)
    stream = coalesce(ready_pieces(), join_text)
    assert await anext(stream) == "first,"
    assert turns == 0  # the callback queued before it has not run yet
    assert [text async for text in stream] == ["second,"]


async def test_leaving_after_the_first_piece_closes_the_source() -> None:
    log: list[str] = []
    stream = coalesce(pieces(10, log), join_text)
    assert await anext(stream) == "0,"
    await stream.aclose()
    assert log == ["source closed"]


async def test_a_slow_consumer_gets_the_pieces_merged_in_order() -> None:
    log: list[str] = []
    received = []
    async for text in coalesce(pieces(40, log), join_text):
        received.append(text)
        for _ in range(5):  # busy elsewhere while the source goes on
            await asyncio.sleep(0)
    assert "".join(received) == "".join(f"{i}," for i in range(40))
    assert len(received) < 40  # merged
    assert log == ["source closed"]


async def test_an_error_arrives_after_the_pieces_before_it() -> None:
    log: list[str] = []
    received = []
    with pytest.raises(RuntimeError, match="stream broke"):
        async for text in coalesce(pieces(10, log, fail_after=3), join_text):
            received.append(text)
    assert "".join(received) == "0,1,2,"
    assert log == ["source closed"]


async def test_leaving_early_stops_and_closes_the_source() -> None:
    log: list[str] = []
    stream = coalesce(pieces(1000, log), join_text)
    first = await anext(stream)
    await stream.aclose()
    assert first.startswith("0,")
    assert log == ["source closed"]


async def test_an_empty_source_ends_without_a_message() -> None:
    log: list[str] = []
    assert [text async for text in coalesce(pieces(0, log), join_text)] == []
    assert log == ["source closed"]


async def test_a_stream_interval_groups_the_pieces_after_the_first() -> None:
    log: list[str] = []
    received = [text async for text in coalesce(pieces(11, log), join_text, interval=3)]
    assert received == ["0,", "1,2,3,", "4,5,6,", "7,8,9,", "10,"]  # the last: what is left
    assert log == ["source closed"]


async def test_with_an_interval_an_error_still_follows_the_pieces_before_it() -> None:
    log: list[str] = []
    received = []
    with pytest.raises(RuntimeError, match="stream broke"):
        async for text in coalesce(pieces(10, log, fail_after=5), join_text, interval=3):
            received.append(text)
    assert received == ["0,", "1,2,3,", "4,"]
    assert log == ["source closed"]


def test_the_stream_interval_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_STREAM_INTERVAL", "4")
    assert load_settings().stream_interval == 4
    monkeypatch.delenv("TRTLLM_STREAM_INTERVAL")
    assert load_settings().stream_interval == 1
    monkeypatch.setenv("TRTLLM_STREAM_INTERVAL", "0")
    with pytest.raises(ValueError, match="TRTLLM_STREAM_INTERVAL"):
        load_settings()
