"""The Responses API's store: bounded by bytes (oldest out first) and by age, and conversations
rebuilt by walking previous_response_id links."""

from __future__ import annotations

import json

from tensorrtllm_backend.serving.responses_api.store import ResponseStore, StoredResponse


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def entry(text: str, previous: str | None = None) -> StoredResponse:
    item = {"type": "message", "role": "user", "content": text}
    return StoredResponse({"id": text, "output": []}, [item], previous)


def size(stored: StoredResponse) -> int:
    return len(json.dumps([stored.response, stored.items], separators=(",", ":")))


def test_the_oldest_leave_first_within_the_byte_budget() -> None:
    one = size(entry("a"))
    store = ResponseStore(max_bytes=3 * one, ttl_s=0)
    for name in "abc":
        store.put(name, entry(name))
    store.put("b", entry("b"))  # stored again: now the newest
    store.put("d", entry("d"))
    assert [name for name in "abcd" if store.get(name) is not None] == ["b", "c", "d"]
    assert len(store) == 3


def test_a_response_larger_than_the_budget_is_not_stored() -> None:
    store = ResponseStore(max_bytes=10, ttl_s=0)
    store.put("a", entry("a"))
    assert store.get("a") is None and len(store) == 0


def test_responses_older_than_the_age_limit_are_forgotten() -> None:
    clock = Clock()
    store = ResponseStore(max_bytes=10_000, ttl_s=60, clock=clock)
    store.put("a", entry("a"))
    clock.now = 30
    store.put("b", entry("b"))
    clock.now = 61
    assert store.get("a") is None and store.get("b") is not None
    clock.now = 200
    assert len(store) == 0


def test_a_budget_of_zero_stores_nothing() -> None:
    store = ResponseStore(max_bytes=0, ttl_s=60)
    store.put("a", entry("a"))
    assert not store.enabled and store.get("a") is None


def test_a_conversation_is_its_chain_of_responses_oldest_first() -> None:
    store = ResponseStore(max_bytes=10_000, ttl_s=0)
    store.put("a", entry("first"))
    store.put("b", entry("second", previous="a"))
    store.put("c", entry("third", previous="b"))
    conversation = store.conversation("c")
    assert conversation is not None
    assert [item["content"] for item in conversation] == ["first", "second", "third"]
    store.delete("a")
    assert store.conversation("c") is None  # a link is gone: the conversation cannot be rebuilt
    assert store.conversation("unknown") is None
