"""The Messages API as Claude Code sends it: a request captured from Claude Code 2.1.332
(tests/data/clients/), system messages among the others, deferred tools, adaptive thinking,
effort, and server-side context editing (the chat request the model sees, and what the answer
reports)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tensorrtllm_backend.serving.anthropic_api.context_editing import (
    CLEARED_RESULT,
    edit_context,
)
from tensorrtllm_backend.serving.anthropic_api.conversion import chat_request
from tensorrtllm_backend.serving.anthropic_api.messages import MessagesServing
from tensorrtllm_backend.serving.anthropic_api.protocol import CountTokensRequest, MessagesRequest
from tensorrtllm_backend.serving.chat.core import ChatCore
from tensorrtllm_backend.serving.generation import EngineLimits, Generator
from tensorrtllm_backend.serving.request_errors import RequestError
from tensorrtllm_backend.triton.client import TritonLLMClient

CAPTURED = Path(__file__).parents[2] / "data" / "clients" / "claude-code-2.1.332-messages.json"
BASH = {"name": "Bash", "input_schema": {"type": "object", "properties": {}}}


@pytest.fixture
def core(demo_tokenizer) -> ChatCore:
    client = TritonLLMClient.__new__(TritonLLMClient)  # never called: nothing is generated
    return ChatCore(Generator(client, demo_tokenizer, EngineLimits(200_000, 200_100)), "m")


def request(**fields: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    return MessagesRequest.model_validate_json(json.dumps({**body, **fields}))


def test_claude_codes_first_request_is_served(core: ChatCore) -> None:
    body = json.loads(CAPTURED.read_text())
    parsed = MessagesRequest.model_validate(body)
    assert parsed.unsupported() is None
    chat = chat_request(parsed, core)
    # One system message first: the top-level system and the system message among the others.
    roles = [m.role for m in chat.messages]
    assert roles[0] == "system" and "system" not in roles[1:]
    assert "Primary working directory" in chat.messages[0].text()
    offered = {tool.function.name for tool in chat.tools or ()}
    assert "Bash" in offered and "DeferredToolPlaceholder" not in offered
    assert chat.chat_template_kwargs == {"reasoning_effort": "high"}  # thinking adaptive: default
    prompt = core.render(chat, core.plan_tools(chat))
    assert 'CALL Bash {"command": "echo MARK-7431"' in prompt


def test_a_deferred_tool_is_offered_once_a_tool_reference_loads_it(core: ChatCore) -> None:
    tools = [BASH, {**BASH, "name": "Later", "defer_loading": True}]
    first = chat_request(request(tools=tools), core)
    assert [t.function.name for t in first.tools or ()] == ["Bash"]
    loaded = request(
        tools=tools,
        messages=[
            {"role": "user", "content": "find a tool"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "s1", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "s1", "content": [
                {"type": "tool_reference", "tool_name": "Later"}]}]},
        ],
    )  # fmt: skip
    assert [t.function.name for t in chat_request(loaded, core).tools or ()] == ["Bash", "Later"]


def test_thinking_on_a_model_that_does_not_think(core: ChatCore) -> None:
    for kind in ("adaptive", "disabled"):
        assert chat_request(request(thinking={"type": kind}), core).chat_template_kwargs is None
    with pytest.raises(RequestError, match="does not think") as refused:
        chat_request(request(thinking={"type": "enabled", "budget_tokens": 1024}), core)
    assert refused.value.param == "thinking"


def tool_history(turns: int, size: int = 400) -> list[dict[str, Any]]:
    """A conversation of `turns` tool uses, each result `size` characters."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look around"}]
    for turn in range(turns):
        name = "Read" if turn % 5 == 0 else "Bash"
        messages.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"step {turn}", "signature": ""},
            {"type": "tool_use", "id": f"t{turn}", "name": name, "input": {"n": turn}}]})  # fmt: skip
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"t{turn}", "content": "x" * size}]})  # fmt: skip
    return messages


def test_clearing_tool_uses_renders_a_shorter_prompt_and_says_what_it_cleared(
    core: ChatCore,
) -> None:
    tools = [BASH, {**BASH, "name": "Read"}]
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 1000},
        "keep": {"type": "tool_uses", "value": 3},
        "exclude_tools": ["Read"],
    }
    parsed = request(tools=tools, messages=tool_history(30))
    parsed_edits = request(
        tools=tools, messages=tool_history(30), context_management={"edits": [edit]}
    )
    chat = chat_request(parsed, core)
    edited, applied = edit_context(chat, parsed_edits.context_management.edits, core)
    (report,) = applied
    # 30 results, 6 of them Read's (excluded), the last 3 of the others kept: 21 cleared.
    assert report["type"] == "clear_tool_uses_20250919" and report["cleared_tool_uses"] == 21
    before, after = core.prompt_tokens(chat), core.prompt_tokens(edited)
    assert report["cleared_input_tokens"] == before - after > 0
    results = [m for m in edited.messages if m.role == "tool"]
    assert sum(m.content == CLEARED_RESULT for m in results) == 21
    assert [m.content == CLEARED_RESULT for m in results[-3:]] == [False] * 3
    # Below its trigger, or unable to clear its minimum, the edit is not applied.
    for change in ({"trigger": {"type": "input_tokens", "value": 10**6}},
                   {"clear_at_least": {"type": "input_tokens", "value": 10**6}}):  # fmt: skip
        again = request(tools=tools, messages=tool_history(30),
                        context_management={"edits": [{**edit, **change}]})  # fmt: skip
        assert edit_context(chat, again.context_management.edits, core) == (chat, [])


def test_clearing_thinking_keeps_the_last_turns(core: ChatCore) -> None:
    keep_two = {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}}
    parsed = request(tools=[BASH, {**BASH, "name": "Read"}], messages=tool_history(5),
                     context_management={"edits": [keep_two]})  # fmt: skip
    chat = chat_request(parsed, core)
    edited, (report,) = edit_context(chat, parsed.context_management.edits, core)
    assert report["cleared_thinking_turns"] == 3
    thinking = [m.reasoning_content for m in edited.messages if m.role == "assistant"]
    assert thinking == [None, None, None, "step 3", "step 4"]
    keep_all = request(context_management={"edits": [{**keep_two, "keep": "all"}]})
    assert edit_context(chat, keep_all.context_management.edits, core) == (chat, [])


def test_count_tokens_reports_the_edited_and_the_original_prompt(core: ChatCore) -> None:
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 10}}
    body = {"model": "m", "tools": [BASH, {**BASH, "name": "Read"}], "messages": tool_history(8),
            "context_management": {"edits": [edit]}}  # fmt: skip
    counted = MessagesServing(core).count_tokens(CountTokensRequest.model_validate(body))
    original = counted["context_management"]["original_input_tokens"]
    assert 0 < counted["input_tokens"] < original
