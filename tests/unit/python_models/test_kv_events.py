"""KV-cache events: vLLM's bytes, and the ZeroMQ publisher driven by real sockets on loopback."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
import zmq

from tensorrtllm_backend.python_models import stub_settings
from tensorrtllm_backend.python_models.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventPublisher,
    encode_batch,
    endpoint_for_rank,
    llmd_topic,
    publisher_from_settings,
)
from tests.waiting import wait_for

LOOPBACK = "tcp://127.0.0.1:0"
TOPIC = llmd_topic("10.0.0.7", 8000, "demo")

# msgspec 0.22.0's encoding of these batches built from vLLM 0.33.0's own Structs
# (vllm/distributed/kv_events.py, copied into a scratch script): our encoder must match it byte
# for byte, map16 header of BlockStored's 16 declared keys included.
VLLM_BYTES = {
    "stored_and_removed": (
        "93cb41da556e4010000093de0008a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
        "92cfab54a98ceb1f0ad207b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647394010203"
        "04aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0"
        "83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739163a66d656469756da34750"
        "5581a474797065b0416c6c426c6f636b73436c656172656400"
    ),
    "optional_fields": (
        "93cb400400000000000092de000ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
        "91c420abababababababababababababababababababababababababababababababab"
        "b1706172656e745f626c6f636b5f68617368c420010101010101010101010101010101010101010101010101"
        "0101010101010101a9746f6b656e5f69647391ce00011170aa626c6f636b5f73697a6501a76c6f72615f6964"
        "03a66d656469756da3475055a96c6f72615f6e616d65a761646170746572aa65787472615f6b657973919"
        "1a761646170746572a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c"
        "5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739201"
        "02a66d656469756dc0a967726f75705f69647801c0"
    ),
}


def stored(first_token: int, block_size: int = 2) -> BlockStored:
    return BlockStored(
        block_hashes=[first_token],
        parent_block_hash=None,
        token_ids=list(range(first_token, first_token + block_size)),
        block_size=block_size,
    )


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def publisher() -> Iterator[KvEventPublisher]:
    pub = KvEventPublisher(LOOPBACK, replay_endpoint=LOOPBACK, topic=TOPIC)
    yield pub
    pub.close()


def recv(sock: zmq.Socket[bytes], timeout_s: float = 5.0) -> list[bytes]:
    assert sock.poll(int(timeout_s * 1000)), "nothing arrived"
    return sock.recv_multipart()


def subscribed(context: zmq.Context[zmq.Socket[bytes]], pub: KvEventPublisher) -> zmq.Socket[bytes]:
    """A SUB socket that already gets the publisher's batches: ZeroMQ drops what is published
    before a new subscription reaches the publisher, so probe until one comes through."""
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    sub.connect(pub.endpoint)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pub.publish([AllBlocksCleared()])
        if sub.poll(50):
            sub.recv_multipart()
            while sub.poll(50):  # the other probes in flight
                sub.recv_multipart()
            return sub
    raise AssertionError("the subscription never reached the publisher")


def replay(
    context: zmq.Context[zmq.Socket[bytes]], pub: KvEventPublisher, start: int
) -> list[list[bytes]]:
    """Ask for the batches from `start` on as vllm-router does (a DEALER), up to the end marker."""
    assert pub.replay_endpoint is not None
    dealer = context.socket(zmq.DEALER)
    dealer.connect(pub.replay_endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    frames = []
    while (reply := recv(dealer))[2] != END_SEQ:
        frames.append(reply)
    assert reply == [b"", b"", END_SEQ, b""]
    dealer.close(linger=0)
    return frames


def test_batches_are_the_bytes_vllm_writes() -> None:
    first = encode_batch(
        [
            BlockStored(
                block_hashes=[12345678901234567890, 7],
                parent_block_hash=None,
                token_ids=[1, 2, 3, 4],
                block_size=2,
            ),
            BlockRemoved(block_hashes=[99]),
            AllBlocksCleared(),
        ],
        ts=1767225600.25,
    )
    second = encode_batch(
        [
            BlockStored(
                block_hashes=[b"\xab" * 32],
                parent_block_hash=b"\x01" * 32,
                token_ids=[70000],
                block_size=1,
                lora_id=3,
                lora_name="adapter",
                extra_keys=[("adapter",)],
                group_idx=0,
                kv_cache_spec_kind="full_attention",
            ),
            BlockRemoved(block_hashes=[1, 2], medium=None, group_idx=1),
        ],
        ts=2.5,
        data_parallel_rank=None,
    )
    assert first.hex() == VLLM_BYTES["stored_and_removed"]
    assert second.hex() == VLLM_BYTES["optional_fields"]


def test_engine_integers_encode_as_python_ints_and_bad_hashes_are_refused() -> None:
    tokens = np.arange(4, dtype=np.int64)
    as_numpy = BlockStored(
        block_hashes=[np.uint64(5)], parent_block_hash=None, token_ids=tokens, block_size=4
    )
    plain = BlockStored(
        block_hashes=[5], parent_block_hash=None, token_ids=[0, 1, 2, 3], block_size=4
    )
    assert encode_batch([as_numpy], ts=1.0) == encode_batch([plain], ts=1.0)
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match="block hash"):
            encode_batch([BlockRemoved(block_hashes=[bad])], ts=1.0)


def test_a_subscriber_gets_topic_seq_payload_in_order(
    publisher: KvEventPublisher, context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    sub = subscribed(context, publisher)
    for first_token in range(0, 10, 2):
        assert publisher.publish([stored(first_token)], ts=100.0 + first_token)

    messages = [recv(sub) for _ in range(5)]
    assert all(len(frames) == 3 and frames[0] == TOPIC.encode() for frames in messages)
    seqs = [int.from_bytes(frames[1], "big") for frames in messages]
    assert all(len(frames[1]) == 8 for frames in messages)
    assert seqs == list(range(seqs[0], seqs[0] + 5))
    assert msgpack.unpackb(messages[1][2]) == [
        102.0,
        [
            {
                "type": "BlockStored",
                "block_hashes": [2],
                "parent_block_hash": None,
                "token_ids": [2, 3],
                "block_size": 2,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
            }
        ],
        0,
    ]


def test_a_late_subscriber_replays_what_it_missed(
    publisher: KvEventPublisher, context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    for first_token in range(3):
        publisher.publish([stored(first_token)])
    assert wait_for(lambda: publisher.published == 3, timeout=5)

    # Its first batch comes after a gap (0..live-1), which it asks the replay socket for.
    sub = subscribed(context, publisher)
    assert publisher.publish([BlockRemoved(block_hashes=[0])])
    live = recv(sub)
    live_seq = int.from_bytes(live[1], "big")

    replayed = replay(context, publisher, 0)
    assert [int.from_bytes(frames[2], "big") for frames in replayed] == list(range(live_seq + 1))
    assert all(frames[0] == b"" and frames[1] == TOPIC.encode() for frames in replayed)
    assert [msgpack.unpackb(frames[3])[1][0]["block_hashes"] for frames in replayed[:3]] == [
        [0],
        [1],
        [2],
    ]
    assert replayed[-1][3] == live[2]
    assert [int.from_bytes(f[2], "big") for f in replay(context, publisher, live_seq)] == [live_seq]


def test_the_replay_keeps_the_last_buffer_batches(context: zmq.Context[zmq.Socket[bytes]]) -> None:
    with KvEventPublisher(LOOPBACK, replay_endpoint=LOOPBACK, buffer_batches=2) as pub:
        for first_token in range(4):
            pub.publish([stored(first_token)])
        assert wait_for(lambda: pub.published == 4, timeout=5)
        # Batches 0 and 1 are gone: the subscriber sees that the replay starts past its gap.
        assert [int.from_bytes(f[2], "big") for f in replay(context, pub, 0)] == [2, 3]


def test_publishing_never_blocks_when_nobody_listens(
    context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    with KvEventPublisher(
        LOOPBACK, replay_endpoint=LOOPBACK, max_queued=4, buffer_batches=5000
    ) as pub:
        started = time.monotonic()
        accepted = sum(pub.publish([stored(n)]) for n in range(5000))
        assert time.monotonic() - started < 10  # ~0.1 s here; a blocked call would hang
        assert accepted + pub.dropped == 5000
        assert pub.dropped > 0  # the thread cannot keep up with a tight loop and a queue of 4
        assert wait_for(lambda: pub.published == accepted, timeout=5)
        # A dropped batch keeps its sequence number: subscribers see the hole.
        seqs = [int.from_bytes(f[2], "big") for f in replay(context, pub, 0)]
        assert len(seqs) == accepted and seqs == sorted(seqs)
        assert len(set(range(5000)) - set(seqs)) == pub.dropped


def test_close_releases_the_ports() -> None:
    pub = KvEventPublisher(LOOPBACK, replay_endpoint=LOOPBACK)
    assert pub.replay_endpoint is not None
    endpoints = [pub.endpoint, pub.replay_endpoint]
    with pytest.raises(OSError, match="cannot bind"):
        KvEventPublisher(pub.endpoint)
    pub.close()
    pub.close()
    assert not pub.publish([AllBlocksCleared()])
    for _ in range(3):
        # Binds both ports again at once: "Address already in use" if they were still held.
        KvEventPublisher(*endpoints).close()


def test_llmd_topics_and_rank_ports() -> None:
    assert llmd_topic("10.1.2.3", 8000, "Qwen/Qwen3-0.6B") == "kv@10.1.2.3:8000@Qwen/Qwen3-0.6B"
    with pytest.raises(ValueError):
        llmd_topic("10.1.2.3", 8000, "a@b")
    assert endpoint_for_rank("tcp://127.0.0.1:5557", 0) == "tcp://127.0.0.1:5557"
    assert endpoint_for_rank("tcp://[::1]:5557", 2) == "tcp://[::1]:5559"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_settings_turn_the_publisher_on(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ENDPOINT", "REPLAY_ENDPOINT", "TOPIC"):
        monkeypatch.delenv(f"TRTLLM_KV_EVENTS_{name}", raising=False)
    assert stub_settings.kv_events_settings() is None
    assert publisher_from_settings() is None

    monkeypatch.setenv(stub_settings.KV_EVENTS_ENDPOINT_ENV, "5557")
    monkeypatch.setenv(stub_settings.KV_EVENTS_REPLAY_ENDPOINT_ENV, "tcp://0.0.0.0:5558")
    assert stub_settings.kv_events_settings() == stub_settings.KvEventsSettings(
        "tcp://127.0.0.1:5557", "tcp://0.0.0.0:5558", ""
    )
    for bad in ("tcp://host", "udp://127.0.0.1:5557", "70000", "tcp://127.0.0.1:0"):
        monkeypatch.setenv(stub_settings.KV_EVENTS_ENDPOINT_ENV, bad)
        with pytest.raises(RuntimeError, match=f"TRTLLM_KV_EVENTS_ENDPOINT='{bad}'"):
            stub_settings.kv_events_settings()
    monkeypatch.delenv(stub_settings.KV_EVENTS_ENDPOINT_ENV)
    with pytest.raises(RuntimeError, match="needs TRTLLM_KV_EVENTS_ENDPOINT"):
        stub_settings.kv_events_settings()

    monkeypatch.delenv(stub_settings.KV_EVENTS_REPLAY_ENDPOINT_ENV)
    port = free_port()
    monkeypatch.setenv(stub_settings.KV_EVENTS_ENDPOINT_ENV, str(port))
    monkeypatch.setenv(stub_settings.KV_EVENTS_TOPIC_ENV, TOPIC)
    pub = publisher_from_settings()
    assert pub is not None
    try:
        assert (pub.endpoint, pub.replay_endpoint) == (f"tcp://127.0.0.1:{port}", None)
    finally:
        pub.close()
