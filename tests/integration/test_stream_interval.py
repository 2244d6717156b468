"""TRTLLM_STREAM_INTERVAL through a real `bentoml serve`: the same text in fewer HTTP messages."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import BentoServer  # tests/integration/conftest.py

pytestmark = pytest.mark.integration

PROMPT = "Once upon a time"
TOKENS = 17
INTERVAL = 4


def _messages(server: BentoServer, path: str, body: dict[str, object]) -> list[bytes]:
    """The body of a streamed answer, one item per HTTP chunk as received."""
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        return [chunk for chunk in response.iter_raw() if chunk]


def _whole_text(server: BentoServer) -> str:
    response = httpx.post(
        f"{server.url}/generate_text",
        json={"prompt": PROMPT, "max_tokens": TOKENS, "ignore_eos": True},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["text"])


@pytest.fixture(scope="module")
def interval_server(
    slow_synthetic_model: str, module_bento_launcher: Callable[..., BentoServer]
) -> BentoServer:
    """50 ms per token: without an interval every token would be a message of its own."""
    return module_bento_launcher(
        slow_synthetic_model, {"TRTLLM_STREAM_INTERVAL": str(INTERVAL)}, wait=True
    )


def test_native_stream_sends_the_first_token_then_groups(interval_server: BentoServer) -> None:
    messages = _messages(
        interval_server,
        "/generate",
        {"prompt": PROMPT, "max_tokens": TOKENS, "ignore_eos": True},
    )
    assert b"".join(messages).decode() == _whole_text(interval_server)
    # One token first, then groups of four: 1 + 16 / 4 messages (one more if the end is apart).
    assert 5 <= len(messages) <= 6, messages


def test_openai_stream_keeps_every_event(interval_server: BentoServer) -> None:
    messages = _messages(
        interval_server,
        "/v1/completions",
        {
            "model": "trtllm-slow", "prompt": PROMPT, "max_tokens": TOKENS,
            "ignore_eos": True, "stream": True, "seed": 0,
        },
    )  # fmt: skip
    events = [
        line.removeprefix("data: ")
        for line in b"".join(messages).decode().split("\n\n")
        if line.startswith("data: ")
    ]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(event)["choices"][0]["text"] for event in events[:-1])
    assert text == _whole_text(interval_server)
    assert len(messages) <= 2 + TOKENS // INTERVAL + 1, messages
