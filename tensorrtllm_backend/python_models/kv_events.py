"""KV-cache events in vLLM's wire format, published over ZeroMQ for prefix-aware routers.

A router in front of several replicas (vllm-router `--policy kv_aware`, llm-d's precise prefix-cache
scorer, NVIDIA Dynamo) learns which replica holds which prefix from the events each engine
publishes as its KV cache stores and evicts blocks. They all read vLLM's format, so this module
writes exactly that (vLLM 0.33's `vllm/distributed/kv_events.py`):

- a PUB socket sends each batch as three frames: the topic, the batch's sequence number (8 bytes,
  big-endian, from 0) and the msgpack payload `[ts, [event, ...], data_parallel_rank]`, where each
  event is a map tagged `"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared"` (vLLM's
  msgspec Structs: the batch `array_like`, events `omit_defaults`, maps since vLLM PR #42892);
- a ROUTER socket, when asked, replays the batches still buffered: a subscriber that saw a gap
  sends `[b"", start_seq (8 bytes)]` from a DEALER (or `start_seq` from a REQ) and gets
  `[b"", topic, seq, payload]` for every buffered batch from `start_seq` on, then the end marker
  `[b"", b"", seq -1 (8 bytes, signed), b""]` (the topic frame since vLLM PR #45177, 0.26).

It runs inside Triton's python stub, called from the CPU engine's scheduler thread: `publish`
encodes and queues, and never waits on a socket or a subscriber; a background thread owns the
sockets. A batch that finds the queue full is dropped, and its sequence number is skipped, so
subscribers see the gap (and ask for a replay, or forget this publisher's blocks) instead of
trusting an index that silently misses an eviction.

    from tensorrtllm_backend.python_models.kv_events import BlockStored, publisher_from_settings

    publisher = publisher_from_settings()  # None unless TRTLLM_KV_EVENTS_ENDPOINT is set
    if publisher is not None:
        publisher.publish(
            [BlockStored(block_hashes=[h1, h2], parent_block_hash=None,
                         token_ids=tokens[:32], block_size=16)]
        )
        ...
        publisher.close()

vllm-router's kv_aware policy hashes `token_ids` itself (so every stored block needs its full
`block_size` tokens, and `--kv-event-block-size` must match) and uses the block hashes only to
chain parents and to find removed blocks: any stable 64-bit int (vLLM's default) or bytes will do.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from .stub_settings import kv_events_settings

log = logging.getLogger(__name__)

BlockHash = int | bytes
# vLLM's name for the engine's own KV cache, whatever the device: routers file "CPU" as a host
# offload tier that costs a transfer.
MEDIUM_GPU = "GPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
_MAX_HASH = 1 << 64


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks now in the cache, each the child of the one before (`parent_block_hash` is
    the parent of the first). Field names, order and defaults are vLLM 0.33's; vLLM added
    `medium` in PR #19737, `lora_name` #27577, `extra_keys` #33304, `group_idx` #37688,
    `kv_cache_spec_*` #40984, and `locality`, `ownership`, `session_id`, `lookahead_token_ids`
    after those. vllm-router 0.1.17 refuses a batch whose events carry `lookahead_token_ids`."""

    block_hashes: Sequence[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: Sequence[int]
    block_size: int
    # Always on the wire (vLLM gives them no default), even when None.
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None
    # On the wire only when set.
    extra_keys: Sequence[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: Sequence[Sequence[int]] | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks evicted from the cache."""

    block_hashes: Sequence[BlockHash]
    medium: str | None = MEDIUM_GPU
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole cache was emptied."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared

# (fields always written, fields written only when not None), in vLLM's declaration order.
_LAYOUT: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {
    BlockStored: (
        (
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium",
            "lora_name",
        ),
        (
            "extra_keys",
            "group_idx",
            "kv_cache_spec_kind",
            "kv_cache_spec_sliding_window",
            "locality",
            "ownership",
            "session_id",
            "lookahead_token_ids",
        ),
    ),
    BlockRemoved: (("block_hashes", "medium"), ("group_idx", "locality", "ownership")),
    AllBlocksCleared: ((), ()),
}


def _hash(value: BlockHash) -> BlockHash:
    if isinstance(value, bytes):
        return value
    number = int(value)
    if not 0 <= number < _MAX_HASH:
        # Routers read hashes as u64 and refuse the whole batch otherwise.
        raise ValueError(f"a block hash must be bytes or an int in [0, 2**64): {value!r}")
    return number


def _normalized(name: str, value: Any) -> Any:
    """Plain Python values for msgpack (the engine may hand over numpy or torch integers)."""
    if value is None:
        return None
    if name == "block_hashes":
        return [_hash(item) for item in value]
    if name == "parent_block_hash":
        return _hash(value)
    if name == "token_ids":
        return [int(token) for token in value]
    if name == "lookahead_token_ids":
        return [[int(token) for token in block] for block in value]
    if name == "extra_keys":
        return [None if keys is None else tuple(keys) for keys in value]
    if name in ("block_size", "lora_id", "group_idx", "kv_cache_spec_sliding_window"):
        return int(value)
    return value


def _map_header(count: int, declared: int) -> bytes:
    # msgspec sizes an omit_defaults struct's map header for all its declared fields plus the
    # tag, then writes the count of those present: a map16 header once that exceeds 15.
    if declared <= 15:
        return bytes([0x80 | count])
    return b"\xde" + count.to_bytes(2, "big")


def encode_event(event: KvEvent) -> bytes:
    """One event as vLLM's msgspec encoder writes it (a tagged map)."""
    always, optional = _LAYOUT[type(event)]
    items: list[tuple[str, Any]] = [("type", type(event).__name__)]
    items += [(name, _normalized(name, getattr(event, name))) for name in always]
    for name in optional:
        value = getattr(event, name)
        if value is not None:
            items.append((name, _normalized(name, value)))
    packer = msgpack.Packer()
    parts = [_map_header(len(items), 1 + len(always) + len(optional))]
    for name, value in items:
        parts.append(packer.pack(name))
        parts.append(packer.pack(value))
    return b"".join(parts)


def encode_batch(events: Sequence[KvEvent], ts: float, data_parallel_rank: int | None = 0) -> bytes:
    """A batch as vLLM's KVEventBatch: `[ts, [event, ...], data_parallel_rank]`, always three
    items (msgspec writes an array_like struct's trailing None too)."""
    packer = msgpack.Packer()
    return b"".join(
        [
            packer.pack_array_header(3),
            packer.pack(float(ts)),
            packer.pack_array_header(len(events)),
            *(encode_event(event) for event in events),
            packer.pack(data_parallel_rank),
        ]
    )


def llmd_topic(pod_ip: str, port: int, model: str) -> str:
    """llm-d's topic, `kv@<pod-ip>:<port>@<model>`: its scorer (scheduler 0.7 on) files the events
    under the pod's address and serving port, and the model name, split at the `@`s."""
    if "@" in pod_ip or "@" in model:
        raise ValueError(f"an llm-d topic's parts cannot contain '@': {pod_ip!r}, {model!r}")
    return f"kv@{pod_ip}:{int(port)}@{model}"


def endpoint_for_rank(endpoint: str, rank: int) -> str:
    """vLLM's layout for several engines of one server (data-parallel ranks): rank r binds the
    configured TCP port + r."""
    if rank == 0:
        return endpoint
    host, _, port = endpoint.rpartition(":")
    return f"{host}:{int(port) + rank}"


class KvEventPublisher:
    """vLLM's ZmqEventPublisher, minus its blocking: a PUB socket (and an optional replay ROUTER)
    bound to the given addresses, fed from a bounded queue by a background thread.

    `endpoint` and `replay_endpoint` are ZeroMQ bind addresses (`tcp://127.0.0.1:5557`; port 0
    picks a free one: see :attr:`endpoint`). `buffer_batches` is how many sent batches the replay
    socket can still return; `max_queued` how many may wait for the thread before `publish`
    drops; `hwm` the PUB socket's high-water mark per subscriber (vLLM's defaults)."""

    _IDLE_S = 0.05  # how long the thread waits for a batch before it looks at the replay socket

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_batches: int = 10_000,
        max_queued: int = 100_000,
        hwm: int = 100_000,
        data_parallel_rank: int | None = 0,
    ) -> None:
        self._topic = topic.encode("utf-8")
        self._rank = data_parallel_rank
        self._queue: queue.Queue[tuple[int, bytes] | None] = queue.Queue(maxsize=max_queued)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_batches)
        self._lock = threading.Lock()  # sequence numbers follow the queue's order
        self._next_seq = 0
        self._closed = False
        self.published = 0
        self.dropped = 0
        # A context of our own: terminating it on close waits until the ports are released.
        self._context = zmq.Context()
        self._pub: zmq.Socket[bytes] | None = None
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub = self._bound(zmq.PUB, endpoint, hwm)
            if replay_endpoint:
                # Room for a whole replay and its end marker (as vLLM sizes it).
                self._replay = self._bound(zmq.ROUTER, replay_endpoint, 2 * (buffer_batches + 1))
        except zmq.ZMQError as error:
            self._close_sockets()
            self._context.term()
            raise OSError(
                f"KV events: cannot bind {endpoint} / {replay_endpoint}: {error}"
            ) from None
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = (
            self._replay.getsockopt_string(zmq.LAST_ENDPOINT) if self._replay else None
        )
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def _bound(self, kind: int, address: str, hwm: int) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, hwm)
        if "[" in address:
            sock.setsockopt(zmq.IPV6, 1)
        try:
            sock.bind(address)
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        return sock

    def publish(self, events: Iterable[KvEvent], ts: float | None = None) -> bool:
        """Queue one batch (the events of one engine step) and return at once: False when it was
        dropped (publisher closed or queue full). An empty batch sends nothing, as in vLLM. A
        block hash that routers cannot read (negative, 2**64 or more) raises ValueError."""
        batch = list(events)
        if not batch:
            return True
        payload = encode_batch(batch, time.time() if ts is None else ts, self._rank)
        with self._lock:
            if self._closed:
                return False
            seq = self._next_seq
            self._next_seq += 1
            try:
                self._queue.put_nowait((seq, payload))
                return True
            except queue.Full:
                self.dropped += 1
                dropped = self.dropped
        if dropped & (dropped - 1) == 0:  # the 1st, 2nd, 4th, 8th... drop
            log.warning("KV events: queue full, batch %d dropped (%d so far)", seq, dropped)
        return False

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued, stop the thread and release the ports."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass  # the thread sees _closed once the queue is drained
        self._thread.join(timeout)
        if self._thread.is_alive():  # pragma: no cover
            log.warning("KV events: the publisher thread did not stop within %.1f s", timeout)
            return
        self._context.term()

    def __enter__(self) -> KvEventPublisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self) -> None:
        try:
            while True:
                try:
                    item = self._queue.get(timeout=self._IDLE_S)
                except queue.Empty:
                    item = None
                if item is not None:
                    self._send(*item)
                elif self._closed and self._queue.empty():
                    return
                if self._replay is not None and self._replay.poll(0):
                    self._serve_replays()
        except Exception:  # pragma: no cover
            log.exception("KV events: the publisher thread failed; no more events are sent")
        finally:
            self._close_sockets()

    def _send(self, seq: int, payload: bytes) -> None:
        assert self._pub is not None
        try:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        except zmq.ZMQError:
            log.exception("KV events: batch %d not sent", seq)
            return
        self._buffer.append((seq, payload))
        self.published += 1

    def _serve_replays(self) -> None:
        assert self._replay is not None
        while True:
            try:
                frames = self._replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3:  # [identity, b"", start_seq]
                log.warning("KV events: replay request of %d frames ignored", len(frames))
                continue
            identity, _, start = frames
            first = int.from_bytes(start, "big")
            try:
                for seq, payload in self._buffer:
                    if seq >= first:
                        self._replay.send_multipart(
                            (identity, b"", self._topic, seq.to_bytes(8, "big"), payload),
                            zmq.NOBLOCK,
                        )
                self._replay.send_multipart((identity, b"", b"", END_SEQ, b""), zmq.NOBLOCK)
            except zmq.ZMQError:
                log.exception("KV events: replay from %d not sent", first)

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)


def publisher_from_settings(rank: int = 0) -> KvEventPublisher | None:
    """The publisher TRTLLM_KV_EVENTS_* ask for (None when TRTLLM_KV_EVENTS_ENDPOINT is unset),
    for engine `rank` of this server: its ports are the configured ones + rank."""
    settings = kv_events_settings()
    if settings is None:
        return None
    replay = settings.replay_endpoint
    return KvEventPublisher(
        endpoint_for_rank(settings.endpoint, rank),
        replay_endpoint=endpoint_for_rank(replay, rank) if replay else None,
        topic=settings.topic,
        data_parallel_rank=rank,
    )
