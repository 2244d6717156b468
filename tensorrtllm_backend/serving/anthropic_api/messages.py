"""Anthropic's Messages API as an adapter over the chat path.

A request becomes the chat core's request (system as the system message, tool_use blocks as the
assistant's tool calls, tool_result blocks as tool messages, tools with their input_schema, `any`
as tool choice "required", stop_sequences as stop strings, thinking as the template's
`enable_thinking`, output_config.format as a JSON-schema response_format) prepared by
:meth:`~..chat.core.ChatCore.prepare`: the same template, tool plan, output constraint, reasoning
plan and engine checks as every chat API. The core's answer steps become content blocks
(thinking, text, tool_use), streamed as Anthropic's events or collected and rendered once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from ...common.engine_api import EngineError
from ..apis import MESSAGES_LABEL
from ..chat.answer import ChatPlan
from ..chat.core import ChatCore
from ..chat.parts import AnswerParts
from ..chat.request import ChatRequest
from ..chat.stream import AnswerStep, answer_steps, collect
from ..chat.usage import TokenCount
from ..generation import PreparedRequest
from ..ids import new_id
from ..schemas import FinishReason
from ..web.sse import named_event
from .context_editing import edit_context
from .conversion import FIELDS, chat_request
from .protocol import CountTokensRequest, MessagesRequest

# --- the answer → content blocks and events ---------------------------------------------------


Event = tuple[str, dict[str, Any]]  # (type, payload without the type)


class ContentBuilder(AnswerParts[Event]):
    """Content blocks: `thinking`, `text`, a `tool_use` per call; each announced by Anthropic's
    stream events (a block starts, its deltas follow, it stops)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[dict[str, Any]] = []

    @property
    def calls(self) -> int:
        return sum(block["type"] == "tool_use" for block in self.blocks)

    def opened(self, kind: str, name: str | None) -> Iterator[Event]:
        if kind == "call":
            block = {"type": "tool_use", "id": new_id("toolu"), "name": name, "input": {}}
        elif kind == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            block = {"type": "text", "text": ""}
        self.blocks.append(block)
        yield "content_block_start", {"index": len(self.blocks) - 1, "content_block": dict(block)}

    def grew(self, kind: str, text: str) -> Iterator[Event]:
        if kind == "call":
            delta = {"type": "input_json_delta", "partial_json": text}
        elif kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": text}
        else:
            delta = {"type": "text_delta", "text": text}
        yield "content_block_delta", {"index": len(self.blocks) - 1, "delta": delta}

    def closed(self, kind: str, text: str) -> Iterator[Event]:
        block = self.blocks[-1]
        if kind == "thinking":
            block["thinking"] = text
        elif kind == "text":
            block["text"] = text
        else:
            try:
                arguments = json.loads(text) if text.strip() else {}
            except ValueError:
                arguments = None
            # A call whose arguments are not a JSON object cannot be a tool_use block: it is
            # the text the model wrote.
            if isinstance(arguments, dict):
                block["input"] = arguments
            else:
                self.blocks[-1] = {"type": "text", "text": text}
        yield "content_block_stop", {"index": len(self.blocks) - 1}


@dataclass
class MessageRun:
    """One message being answered: the core request, its plan, the context edits applied."""

    prepared: PreparedRequest
    plan: ChatPlan
    model: str
    applied_edits: list[dict[str, Any]] = field(default_factory=list)


class MessagesServing:
    """`/v1/messages` and `/v1/messages/count_tokens`."""

    def __init__(self, core: ChatCore) -> None:
        self.core = core

    def chat(self, request: CountTokensRequest) -> tuple[ChatRequest, list[dict[str, Any]]]:
        """The chat request, its context edits applied (blocking: they render the prompt)."""
        chat = chat_request(request, self.core)
        if request.context_management is None:
            return chat, []
        return edit_context(chat, request.context_management.edits, self.core)

    async def prepare(self, request: MessagesRequest, size: int = 0) -> MessageRun:
        """The message to answer (`size`: the request body's bytes)."""
        chat, applied = await self.core.generator.offloader.run(size, self.chat, request)
        prepared, plan = await self.core.prepare(chat, size, MESSAGES_LABEL, FIELDS)
        return MessageRun(prepared, plan, request.model, applied)

    def count_tokens(self, request: CountTokensRequest) -> dict[str, Any]:
        """The prompt's tokens; with context edits that apply, before them too."""
        chat = chat_request(request, self.core)
        counted: dict[str, Any] = {"input_tokens": self.core.prompt_tokens(chat)}
        if request.context_management is not None:
            edited, applied = edit_context(chat, request.context_management.edits, self.core)
            if applied:
                original = counted["input_tokens"]
                counted = {
                    "input_tokens": self.core.prompt_tokens(edited),
                    "context_management": {"original_input_tokens": original},
                }
        return counted

    def _message(self, run: MessageRun, content: list[dict[str, Any]]) -> dict[str, Any]:
        prepared = run.prepared
        message: dict[str, Any] = {
            "id": f"msg_{prepared.request_id}",
            "type": "message",
            "role": "assistant",
            "model": run.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": len(prepared.prompt_ids),
                "output_tokens": 0,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            },
        }
        if run.applied_edits:
            message["context_management"] = {"applied_edits": run.applied_edits}
        return message

    async def create(self, run: MessageRun) -> dict[str, Any]:
        """The whole message: the answer's steps collected, rendered once."""
        prepared = run.prepared
        answer = await collect(prepared, answer_steps(self.core.generator, prepared, run.plan))
        (sequence,) = answer.sequences
        content = ContentBuilder()
        content.build(sequence.events)
        message = self._message(run, content.blocks)
        message["stop_reason"], message["stop_sequence"] = _stop(
            sequence.finish_reason, sequence.stop, content.calls
        )
        message["usage"].update(_usage(answer.usage))
        return message

    async def stream(self, run: MessageRun) -> AsyncIterator[str]:
        """Anthropic's stream of events. The first events wait for the engine's first answer,
        so a failure before it still gets an error status."""
        prepared = run.prepared
        content = ContentBuilder()
        usage = TokenCount(len(prepared.prompt_ids))

        def started() -> list[Event]:
            return [("message_start", {"message": self._message(run, [])}),
                    ("ping", {})]  # fmt: skip

        def ended(last: AnswerStep) -> Iterator[Event]:
            yield from content.close()
            stop_reason, stop_sequence = _stop(last.finish_reason, last.stop, content.calls)
            delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
            ending = {"delta": delta, "usage": _usage(usage)}
            if run.applied_edits:
                ending["context_management"] = {"applied_edits": run.applied_edits}
            yield "message_delta", ending
            yield "message_stop", {}

        def failed(error: EngineError) -> list[Event]:
            return [("error", {"error": {"type": "api_error", "message": str(error)}})]

        steps = answer_steps(self.core.generator, prepared, run.plan)
        async for kind, payload in content.stream(steps, usage, started, ended, failed):
            yield named_event(kind, {"type": kind, **payload})


def _usage(usage: TokenCount) -> dict[str, int]:
    """Anthropic's counts: input_tokens are the prompt tokens not read from the cache."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def _stop(finish: FinishReason | None, stop: str | None, calls: int) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence of a finished answer."""
    if finish is FinishReason.LENGTH:
        return "max_tokens", None
    if stop is not None:
        return "stop_sequence", stop
    return ("tool_use" if calls else "end_turn"), None
