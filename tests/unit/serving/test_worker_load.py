"""Workers sharing their load (serving/worker_load.py): the board in a shared file, the fair-share
rule, and a worker above its share answering with `Connection: close`, which a real uvicorn
server turns into a closed connection after the answer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import uvicorn

from tensorrtllm_backend.serving import worker_load
from tensorrtllm_backend.serving.guard import GuardMiddleware
from tensorrtllm_backend.serving.worker_load import BOARD_NAME, LoadBoard, board_for
from tensorrtllm_backend.settings import Settings
from tensorrtllm_backend.triton.command import find_free_port


def boards(path: Path, workers: int) -> list[LoadBoard]:
    """Every worker's view of one board, as the workers' processes would map it."""
    return [LoadBoard(path, workers, index) for index in range(workers)]


def test_every_worker_sees_what_the_others_publish(tmp_path: Path) -> None:
    first, second, third = boards(tmp_path / BOARD_NAME, 3)
    first.publish(5)
    third.publish(2)
    assert second.loads() == [5, 0, 2]
    assert (tmp_path / BOARD_NAME).stat().st_size == 3 * worker_load.SLOT_BYTES


def test_a_worker_above_its_share_by_the_margin_lets_go(tmp_path: Path) -> None:
    # Generations the other three workers run, and this one's: a share of 33 and a margin of
    # 4.1 with 40 here; of 32 and 4 with 36.
    path = tmp_path / BOARD_NAME
    workers = boards(path, 4)
    for board, load in zip(workers[1:], (36, 36, 20), strict=True):
        board.publish(load)
    assert workers[0].over_share(40)
    assert not workers[0].over_share(36)
    assert not workers[3].over_share(20)
    # Few streams: the margin is one generation, so two on one worker and none elsewhere move.
    few = boards(path.with_name("few"), 4)
    assert few[0].over_share(2) and not few[0].over_share(1)


def test_connections_being_let_go_count_for_the_share_not_for_what_the_worker_keeps(
    tmp_path: Path,
) -> None:
    busy, idle = boards(tmp_path / BOARD_NAME, 2)
    busy.publish(10)
    idle.publish(2)
    assert busy.over_share(10)  # keeps 10 of 12: a share of 6 + 1
    busy.releasing = 3
    assert idle.loads() == [10, 2]  # its clients are still served there
    assert not busy.over_share(10)  # keeps 7: what it lets go already suffices
    busy.releasing = 2
    assert busy.over_share(10)


def test_a_worker_that_replaces_a_dead_one_starts_from_nothing(tmp_path: Path) -> None:
    dead, other = boards(tmp_path / BOARD_NAME, 2)
    dead.publish(40)
    replacement = LoadBoard(tmp_path / BOARD_NAME, 2, 0)
    assert other.loads() == [0, 0] and replacement.loads() == [0, 0]


@pytest.mark.parametrize(
    ("settings", "index"),
    [
        ({"workers": 1}, 1),
        ({"workers": 2, "rebalance_connections": False}, 1),
        ({"workers": 2}, None),  # not a BentoML worker: a test's app, a script
    ],
)
def test_no_board_without_several_workers_or_when_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any], index: int | None
) -> None:
    monkeypatch.setattr(worker_load.server_context, "worker_index", index)
    assert board_for(Settings(shared_dir=tmp_path, **settings)) is None


def test_a_worker_gets_its_slot_from_its_bentoml_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_load.server_context, "worker_index", 2)  # BentoML counts from 1
    board = board_for(Settings(shared_dir=tmp_path, workers=3))
    assert board is not None and board.index == 1 and board.workers == 3
    assert board_for(Settings(shared_dir=tmp_path, workers=3)) is board  # one per process


def test_an_unwritable_shared_dir_leaves_the_worker_serving_without_a_board(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_load.server_context, "worker_index", 1)
    missing = tmp_path / "gone"
    assert board_for(Settings(shared_dir=missing, workers=2)) is None


class Generation:
    """An API that streams one piece and waits until told to finish: a generation in flight."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finish = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"piece ", "more_body": True})
        self.started.set()
        await self.finish.wait()
        await send({"type": "http.response.body", "body": b"end"})


def released() -> float:
    """trtllm_connections_released_total of this process."""
    return prometheus_client.REGISTRY.get_sample_value("trtllm_connections_released_total") or 0.0


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[int]:
    """`app` behind a real uvicorn on a free loopback port, for the duration."""
    port = find_free_port()
    # log_config=None: uvicorn's logging setup would change this process's loggers for the tests
    # that run after this one.
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_config=None)
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def post(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A keep-alive POST /generate: the connection and the head of its answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /generate HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
        b"content-length: 2\r\n\r\n{}"
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    return reader, writer, head.lower()


async def test_the_worker_above_its_share_closes_that_connection_after_the_answer(
    tmp_path: Path,
) -> None:
    # This worker and three idle ones: a second generation puts it above its share.
    this, *_others = boards(tmp_path / BOARD_NAME, 4)
    released_before = released()
    app = Generation()
    middleware = GuardMiddleware(app, Settings())
    middleware.board = this
    async with served(middleware) as port:
        _, kept_writer, kept_head = await post(port)
        await asyncio.wait_for(app.started.wait(), 5)
        app.started.clear()
        released_reader, released_writer, released_head = await post(port)
        await asyncio.wait_for(app.started.wait(), 5)
        assert b"connection: close" not in kept_head
        assert b"connection: close" in released_head
        assert this.loads()[0] == 2 and this.releasing == 1
        assert released() == released_before + 1
        app.finish.set()
        rest = await asyncio.wait_for(released_reader.read(), 5)  # EOF: the server closed it
        assert rest.endswith(b"end\r\n0\r\n\r\n")
        for writer in (kept_writer, released_writer):
            writer.close()
    assert this.loads()[0] == 0 and this.releasing == 0 and middleware.in_flight == 0
