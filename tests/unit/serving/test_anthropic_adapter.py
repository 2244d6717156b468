"""Anthropic's Messages API translated: content blocks into chat messages (tool results as tool
messages, tool_use as the assistant's calls, thinking as its reasoning), tool choices into the
chat API's, what cannot be served refused, and answer events into content blocks with Anthropic's
stream events; stop reasons from how the answer ended."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from tensorrtllm_backend.serving.anthropic_api.conversion import chat_messages
from tensorrtllm_backend.serving.anthropic_api.messages import ContentBuilder, _stop
from tensorrtllm_backend.serving.anthropic_api.protocol import MessagesRequest
from tensorrtllm_backend.serving.chat.events import (
    ArgumentsDelta,
    CallStart,
    ContentDelta,
)
from tensorrtllm_backend.serving.chat.reasoning import ReasoningDelta
from tensorrtllm_backend.serving.chat.stream import AnswerStep
from tensorrtllm_backend.serving.schemas import FinishReason

TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}


def request(**fields: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    return MessagesRequest.model_validate_json(json.dumps({**body, **fields}))


def test_blocks_become_chat_messages() -> None:
    parsed = request(
        system=[{"type": "text", "text": "Be terse."}],
        messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "use the tool", "signature": ""},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "cold"},
                {"type": "tool_result", "tool_use_id": "t2", "content": [
                    {"type": "text", "text": "down"}], "is_error": True},
                {"type": "text", "text": "Thanks"},
            ]},
        ],
    )  # fmt: skip
    messages = chat_messages(parsed.system_text(), parsed.messages)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    assistant = messages[2]
    assert assistant["content"] == "Checking." and assistant["reasoning_content"] == "use the tool"
    (call,) = assistant["tool_calls"]
    assert call["id"] == "t1" and json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert messages[4] == {"role": "tool", "tool_call_id": "t2", "content": "Error: down"}
    assert messages[5] == {"role": "user", "content": "Thanks"}


def test_a_user_turn_of_tool_results_only_adds_no_empty_message() -> None:
    parsed = request(
        messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        ]
    )
    assert chat_messages(None, parsed.messages) == [
        {"role": "tool", "tool_call_id": "t1", "content": ""}
    ]


PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


def test_a_tool_results_images_stay_in_its_tool_message_where_they_stand() -> None:
    """Claude Code's Read of an image file, or a screenshot tool: image blocks in the result."""
    parsed = request(
        messages=[
            {"role": "user", "content": "Open a.png"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a.png"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "a.png:"}, {"type": "image", "source": PNG}]},
                {"type": "tool_result", "tool_use_id": "t2", "is_error": True, "content": [
                    {"type": "image", "source": {"type": "url", "url": "https://a.example/x"}},
                    {"type": "text", "text": "blurred"}]},
            ]},
        ]
    )  # fmt: skip
    url = f"data:image/png;base64,{PNG['data']}"
    assert chat_messages(None, parsed.messages)[2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": [
            {"type": "text", "text": "a.png:"},
            {"type": "image_url", "image_url": {"url": url}, "where": "messages.2.content.0.content.1"},
        ]},
        {"role": "tool", "tool_call_id": "t2", "content": [
            {"type": "text", "text": "Error: "},
            {"type": "image_url", "image_url": {"url": "https://a.example/x"},
             "where": "messages.2.content.1.content.0"},
            {"type": "text", "text": "blurred"},
        ]},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"type": "image", "source": {"type": "base64", "data": "x"}}, "needs media_type and data"),
        ({"type": "document", "source": {"type": "text", "data": "x"}}, "type 'document' are not"),
    ],
)
def test_what_a_tool_result_cannot_hold_is_a_400_saying_so(block: dict, message: str) -> None:
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [block]}
    with pytest.raises(ValidationError, match=message):
        request(messages=[{"role": "user", "content": [result]}])


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"mcp_servers": [{"url": "x"}]}, "mcp_servers"),
    ],
)
def test_what_cannot_be_done_is_named(fields: dict[str, Any], param: str) -> None:
    refused = request(**fields).unsupported()
    assert refused is not None and refused[0] == param


def test_neutral_fields_pass() -> None:
    assert request(tools=[TOOL, {**TOOL, "name": "g", "type": "custom"}]).unsupported() is None


def test_answer_events_become_blocks_and_anthropics_events() -> None:
    content = ContentBuilder()
    events = [
        ReasoningDelta("hmm"),
        ContentDelta("Sure."),
        CallStart(0, "get_weather"),
        ArgumentsDelta(0, '{"city": '),
        ArgumentsDelta(0, '"Oslo"}'),
    ]
    stream = list(content.feed(events)) + list(content.close())
    assert [kind for kind, _ in stream] == [
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop",
    ]  # fmt: skip
    assert [payload["index"] for _, payload in stream] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert stream[6][1]["content_block"]["input"] == {}
    assert stream[7][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": '}
    assert content.blocks == [
        {"type": "thinking", "thinking": "hmm", "signature": ""},
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": content.blocks[2]["id"], "name": "get_weather",
         "input": {"city": "Oslo"}},
    ]  # fmt: skip
    assert content.calls == 1


def test_a_call_whose_arguments_are_no_object_is_text() -> None:
    content = ContentBuilder()
    list(content.feed([CallStart(0, "f"), ArgumentsDelta(0, "[1, 2")]))
    list(content.close())
    assert content.blocks == [{"type": "text", "text": "[1, 2"}]


@pytest.mark.parametrize(
    ("step", "calls", "expected"),
    [
        (AnswerStep(0, finish_reason=FinishReason.LENGTH), 0, ("max_tokens", None)),
        (AnswerStep(0, finish_reason=FinishReason.STOP, stop="\n\n"), 0, ("stop_sequence", "\n\n")),
        (AnswerStep(0, finish_reason=FinishReason.STOP), 1, ("tool_use", None)),
        (AnswerStep(0, finish_reason=FinishReason.STOP), 0, ("end_turn", None)),
    ],
)
def test_stop_reasons(step: AnswerStep, calls: int, expected: tuple[str, str | None]) -> None:
    assert _stop(step.finish_reason, step.stop, calls) == expected
