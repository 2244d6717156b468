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
from typing import Any

from ...common.engine_api import EngineError
from ..apis import MESSAGES_LABEL
from ..chat.answer import ChatPlan
from ..chat.core import ChatCore
from ..chat.core import chat_request as to_chat
from ..chat.parts import AnswerParts
from ..chat.request import ChatRequest
from ..chat.stream import AnswerStep, answer_steps, collect
from ..chat.usage import TokenCount
from ..generation import PreparedRequest
from ..ids import new_id
from ..request_errors import RequestError
from ..schemas import FinishReason
from ..web.sse import named_event
from .protocol import (
    CountTokensRequest,
    Message,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

# Chat fields named in errors, and the Messages field they came from.
FIELDS = {
    "response_format": "output_config.format",
    "max_completion_tokens": "max_tokens",
    "stop": "stop_sequences",
}


# --- request → chat request ------------------------------------------------------------------


def chat_messages(system: str | None, messages: list[Message]) -> list[dict[str, Any]]:
    """The conversation as chat messages: a user turn's tool results come first, as tool
    messages; an assistant turn's tool_use blocks are its tool calls, its thinking the message's
    reasoning."""
    converted: list[dict[str, Any]] = []
    if system:
        converted.append({"role": "system", "content": system})
    for message in messages:
        blocks = (
            [TextBlock(type="text", text=message.content)]
            if isinstance(message.content, str)
            else message.content
        )
        text = "".join(block.text for block in blocks if isinstance(block, TextBlock))
        if message.role == "user":
            for block in blocks:
                if isinstance(block, ToolResultBlock):
                    converted.append(
                        {"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()}
                    )
            if text or not any(isinstance(block, ToolResultBlock) for block in blocks):
                converted.append({"role": "user", "content": text})
            continue
        assistant: dict[str, Any] = {"role": "assistant", "content": text or None}
        calls = [
            {
                "id": block.id,
                "type": "function",
                "function": {"name": block.name, "arguments": json.dumps(block.input)},
            }
            for block in blocks
            if isinstance(block, ToolUseBlock)
        ]
        if calls:
            assistant["tool_calls"] = calls
        thinking = "".join(block.thinking for block in blocks if isinstance(block, ThinkingBlock))
        if thinking:
            assistant["reasoning_content"] = thinking
        converted.append(assistant)
    return converted


def chat_request(request: CountTokensRequest, core: ChatCore) -> ChatRequest:
    """The chat request an Anthropic request is served as."""
    values: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(request.system_text(), request.messages),
    }
    if request.tools is not None:
        values["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.input_schema,
                },
            }
            for tool in request.tools
        ]
    choice = request.tool_choice
    if choice is not None:
        if choice.type == "tool":
            if not choice.name:
                raise RequestError(
                    'tool_choice "tool" needs the name of the tool', param="tool_choice"
                )
            values["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            values["tool_choice"] = {"any": "required"}.get(choice.type, choice.type)
        values["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    if request.thinking is not None:
        thinks = request.thinking.type != "disabled"
        if thinks and core.reasoning_format is None:
            raise RequestError(
                "thinking: this model does not think (no reasoning format; see "
                "TRTLLM_REASONING_PARSER)",
                param="thinking",
            )
        if core.reasoning_format is not None:
            values["chat_template_kwargs"] = {"enable_thinking": thinks}
    output = request.output_config.format if request.output_config else None
    # A forced call answers with the call alone: there is no text for the format to shape.
    forced = values.get("tool_choice") not in (None, "none", "auto")
    if output is not None and not forced:
        values["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": output.json_schema},
        }
    if isinstance(request, MessagesRequest):
        values.update(
            max_completion_tokens=request.max_tokens,
            stop=request.stop_sequences,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            stream=request.stream,
        )
    return to_chat(values, FIELDS)


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


class MessagesServing:
    """`/v1/messages` and `/v1/messages/count_tokens`."""

    def __init__(self, core: ChatCore) -> None:
        self.core = core

    async def prepare(
        self, request: MessagesRequest, size: int = 0
    ) -> tuple[PreparedRequest, ChatPlan]:
        """The core request and its plan (`size`: the request body's bytes)."""
        chat = chat_request(request, self.core)
        return await self.core.prepare(chat, size, MESSAGES_LABEL, FIELDS)

    def count_tokens(self, request: CountTokensRequest) -> dict[str, int]:
        return {"input_tokens": self.core.prompt_tokens(chat_request(request, self.core))}

    def _message(
        self, prepared: PreparedRequest, model: str, content: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {
            "id": f"msg_{prepared.request_id}",
            "type": "message",
            "role": "assistant",
            "model": model,
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

    async def create(self, prepared: PreparedRequest, plan: ChatPlan, model: str) -> dict[str, Any]:
        """The whole message: the answer's steps collected, rendered once."""
        answer = await collect(prepared, answer_steps(self.core.generator, prepared, plan))
        (sequence,) = answer.sequences
        content = ContentBuilder()
        content.build(sequence.events)
        message = self._message(prepared, model, content.blocks)
        message["stop_reason"], message["stop_sequence"] = _stop(
            sequence.finish_reason, sequence.stop, content.calls
        )
        message["usage"].update(_usage(answer.usage))
        return message

    async def stream(
        self, prepared: PreparedRequest, plan: ChatPlan, model: str
    ) -> AsyncIterator[str]:
        """Anthropic's stream of events. The first events wait for the engine's first answer,
        so a failure before it still gets an error status."""
        content = ContentBuilder()
        usage = TokenCount(len(prepared.prompt_ids))

        def started() -> list[Event]:
            return [("message_start", {"message": self._message(prepared, model, [])}),
                    ("ping", {})]  # fmt: skip

        def ended(last: AnswerStep) -> Iterator[Event]:
            yield from content.close()
            stop_reason, stop_sequence = _stop(last.finish_reason, last.stop, content.calls)
            delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
            yield "message_delta", {"delta": delta, "usage": _usage(usage)}
            yield "message_stop", {}

        def failed(error: EngineError) -> list[Event]:
            return [("error", {"error": {"type": "api_error", "message": str(error)}})]

        steps = answer_steps(self.core.generator, prepared, plan)
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
