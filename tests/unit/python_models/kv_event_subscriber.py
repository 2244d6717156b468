"""A router's side of the KV-event stream, for tests that check what a publisher's events add
up to: a ZeroMQ SUB socket that applies each batch (vLLM's msgpack format) to the set of block
hashes it believes the engine holds: stored blocks are added, removed ones dropped, a cleared
cache emptied."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Callable

import msgpack
import zmq


def free_endpoint() -> str:
    """A TCP address on loopback that nothing listens on (for TRTLLM_KV_EVENTS_ENDPOINT)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


class BlockIndex:
    """The blocks a subscriber to `endpoint` believes are held. Every stored block must carry its
    full `block_size` tokens, as routers that hash token ids need."""

    def __init__(self, endpoint: str, block_size: int) -> None:
        self.block_size = block_size
        self.held: set[int | bytes] = set()
        self.batches = 0
        self.events: Counter[str] = Counter()  # event type -> how many arrived
        self.log: list[dict] = []  # every event, in the order it arrived
        self._socket = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(endpoint)

    def drain(self) -> set[int | bytes]:
        """Apply every batch that arrived; the blocks now held."""
        while self._socket.poll(0):
            _topic, _seq, payload = self._socket.recv_multipart()
            _ts, events, _rank = msgpack.unpackb(payload)
            for event in events:
                self.events[event["type"]] += 1
                self.log.append(event)
                if event["type"] == "BlockStored":
                    assert event["block_size"] == self.block_size, event
                    assert len(event["token_ids"]) == self.block_size * len(event["block_hashes"])
                    self.held.update(event["block_hashes"])
                elif event["type"] == "BlockRemoved":
                    self.held.difference_update(event["block_hashes"])
                else:
                    self.held.clear()
            self.batches += 1
        return self.held

    def heard(self, probe: Callable[[], object]) -> bool:
        """Whether the subscription reached the publisher: `probe` publishes something that
        changes nothing (ZeroMQ drops what is published before it arrives), then what came is
        applied. Call it until true, before the events that count."""
        probe()
        self.drain()
        return self.batches > 0

    def close(self) -> None:
        self._socket.close(linger=0)

    def __enter__(self) -> BlockIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
