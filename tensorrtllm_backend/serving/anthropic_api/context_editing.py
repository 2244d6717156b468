"""Anthropic's server-side context editing (`context_management.edits`), applied to the chat
request before it is prepared: the client keeps its whole history, the model sees the edited one,
and the answer reports what was cleared (`context_management.applied_edits`).

* `clear_tool_uses_20250919`: once the prompt reaches `trigger` input tokens (100,000 by
  default), the results of all but the last `keep` tool uses (3) become a short placeholder,
  except those of `exclude_tools`; `clear_tool_inputs` empties the calls' arguments too. An edit
  that would clear fewer than `clear_at_least` input tokens is not applied.
* `clear_thinking_20251015`: the thinking of all but the last `keep` assistant turns that have
  some (1 by default; "all" keeps every one).

Blocking (it renders the prompt to count its tokens): the Messages API runs it off the event
loop when the request is large.
"""

from __future__ import annotations

from typing import Any

from ..chat.core import ChatCore
from ..chat.request import ChatMessage, ChatRequest, ToolCall
from .protocol import ContextEdit

CLEARED_RESULT = "[tool result cleared to save context]"
DEFAULT_TRIGGER = 100_000  # input tokens
DEFAULT_KEEP_TOOL_USES = 3
DEFAULT_KEEP_THINKING = 1


def edit_context(
    chat: ChatRequest, edits: list[ContextEdit], core: ChatCore
) -> tuple[ChatRequest, list[dict[str, Any]]]:
    """The chat request with `edits` applied, in order, and the applied edits as the answer
    reports them."""
    applied = []
    for edit in edits:
        if edit.type == "clear_thinking_20251015":
            chat, result = _clear_thinking(chat, edit, core)
        else:
            chat, result = _clear_tool_uses(chat, edit, core)
        if result is not None:
            applied.append(result)
    return chat, applied


def _with_messages(chat: ChatRequest, messages: list[ChatMessage]) -> ChatRequest:
    return chat.model_copy(update={"messages": messages})


def _clear_thinking(
    chat: ChatRequest, edit: ContextEdit, core: ChatCore
) -> tuple[ChatRequest, dict[str, Any] | None]:
    if edit.keep == "all":
        return chat, None
    keep = edit.keep.value if edit.keep is not None else DEFAULT_KEEP_THINKING
    thinking = [i for i, m in enumerate(chat.messages) if m.role == "assistant" and _thinks(m)]
    cleared = thinking[: max(0, len(thinking) - keep)]
    if not cleared:
        return chat, None
    messages = list(chat.messages)
    for i in cleared:
        messages[i] = messages[i].model_copy(update={"reasoning_content": None, "reasoning": None})
    edited = _with_messages(chat, messages)
    saved = core.prompt_tokens(chat) - core.prompt_tokens(edited)
    return edited, {
        "type": edit.type,
        "cleared_thinking_turns": len(cleared),
        "cleared_input_tokens": max(0, saved),
    }


def _thinks(message: ChatMessage) -> bool:
    return bool(message.reasoning_content or message.reasoning)


def _clear_tool_uses(
    chat: ChatRequest, edit: ContextEdit, core: ChatCore
) -> tuple[ChatRequest, dict[str, Any] | None]:
    trigger = edit.trigger.value if edit.trigger is not None else DEFAULT_TRIGGER
    keep = DEFAULT_KEEP_TOOL_USES
    if edit.keep is not None and edit.keep != "all":
        keep = edit.keep.value
    elif edit.keep == "all":
        return chat, None
    before = core.prompt_tokens(chat)
    if before < trigger:
        return chat, None
    names = {
        call.id: call.function.name
        for message in chat.messages
        for call in message.tool_calls or ()
    }
    excluded = set(edit.exclude_tools or ())
    results = [
        i
        for i, m in enumerate(chat.messages)
        if m.role == "tool" and names.get(m.tool_call_id or "") not in excluded
    ]
    cleared = results[: max(0, len(results) - keep)]
    if not cleared:
        return chat, None
    messages = list(chat.messages)
    cleared_ids = set()
    for i in cleared:
        cleared_ids.add(messages[i].tool_call_id)
        messages[i] = messages[i].model_copy(update={"content": CLEARED_RESULT})
    if edit.clear_tool_inputs:
        for i, message in enumerate(messages):
            if message.tool_calls and any(c.id in cleared_ids for c in message.tool_calls):
                calls = [_emptied(c) if c.id in cleared_ids else c for c in message.tool_calls]
                messages[i] = message.model_copy(update={"tool_calls": calls})
    edited = _with_messages(chat, messages)
    saved = max(0, before - core.prompt_tokens(edited))
    if edit.clear_at_least is not None and saved < edit.clear_at_least.value:
        return chat, None
    return edited, {
        "type": edit.type,
        "cleared_tool_uses": len(cleared),
        "cleared_input_tokens": saved,
    }


def _emptied(call: ToolCall) -> ToolCall:
    function = call.function.model_copy(update={"arguments": "{}"})
    return call.model_copy(update={"function": function})
