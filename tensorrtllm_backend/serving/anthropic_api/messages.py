"""Anthropic's Messages API as an adapter over the chat path.

A request becomes a chat request (system as the system message, tool_use blocks as the assistant's
tool calls, tool_result blocks as tool messages, tools with their input_schema, `any` as tool choice
"required", stop_sequences as stop strings, thinking as the template's `enable_thinking`,
output_config.format as a JSON-schema response_format) prepared by
:meth:`~..openai_api.serving.OpenAIServing.prepare_chat`: the same template, tool plan, output
constraint, reasoning plan and engine checks. The answer is read with the chat path's answer reader
as it is generated and becomes content blocks (thinking, text, tool_use), whole or as Anthropic's
stream of events.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

from pydantic import ValidationError

from ...common.engine_api import EngineError
from ..generation import PreparedRequest
from ..openai_api.answers import AnswerEvent, AnswerStep, ChatPlan, answer_steps
from ..openai_api.protocol import ChatCompletionRequest
from ..openai_api.reasoning import ReasoningDelta
from ..openai_api.serving import OpenAIError, OpenAIServing
from ..openai_api.tool_events import ArgumentsDelta, CallStart, ContentDelta
from ..schemas import FinishReason
from .protocol import (
    CountTokensRequest,
    Message,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    unsupported,
)

API_LABEL = "anthropic_messages"
# Chat fields named in errors, and the Messages field they came from.
_PARAMS = {
    "response_format": "output_config.format",
    "max_completion_tokens": "max_tokens",
    "stop": "stop_sequences",
    "tool_choice": "tool_choice",
}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


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


def chat_request(request: CountTokensRequest, serving: OpenAIServing) -> ChatCompletionRequest:
    """The chat request an Anthropic request is served as."""
    refused = unsupported(request)
    if refused is not None:
        raise OpenAIError(refused[1], param=refused[0])
    fields: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(request.system_text(), request.messages),
    }
    if request.tools is not None:
        fields["tools"] = [
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
                raise OpenAIError(
                    'tool_choice "tool" needs the name of the tool', param="tool_choice"
                )
            fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            fields["tool_choice"] = {"any": "required"}.get(choice.type, choice.type)
        fields["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    if request.thinking is not None:
        thinks = request.thinking.type != "disabled"
        if thinks and serving.reasoning_format is None:
            raise OpenAIError(
                "thinking: this model does not think (no reasoning format; see "
                "TRTLLM_REASONING_PARSER)",
                param="thinking",
            )
        if serving.reasoning_format is not None:
            fields["chat_template_kwargs"] = {"enable_thinking": thinks}
    output = request.output_config.format if request.output_config else None
    # A forced call answers with the call alone: there is no text for the format to shape.
    forced = fields.get("tool_choice") not in (None, "none", "auto")
    if output is not None and not forced:
        fields["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": output.json_schema},
        }
    if isinstance(request, MessagesRequest):
        fields.update(
            max_completion_tokens=request.max_tokens,
            stop=request.stop_sequences,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            stream=request.stream,
        )
    try:
        return ChatCompletionRequest.model_validate(
            {name: value for name, value in fields.items() if value is not None}
        )
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        location = [str(part) for part in first.get("loc", ())]
        param = _PARAMS.get(location[0], location[0]) if location else None
        raise OpenAIError(f"{'.'.join(location)}: {first.get('msg')}", param=param) from None


# --- the answer → content blocks and events ---------------------------------------------------


class ContentBuilder:
    """The content blocks of an answer, built from its events, with the stream events that
    announce them (a block starts, its deltas follow, it stops)."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._kind = ""  # thinking | text | tool_use
        self._arguments: list[str] = []

    @property
    def calls(self) -> int:
        return sum(block["type"] == "tool_use" for block in self.blocks)

    def feed(self, events: list[AnswerEvent]) -> Iterator[tuple[str, dict[str, Any]]]:
        for event in events:
            if isinstance(event, ReasoningDelta):
                yield from self._text("thinking", event.text)
            elif isinstance(event, ContentDelta):
                yield from self._text("text", event.text)
            elif isinstance(event, CallStart):
                yield from self.close()
                block = {
                    "type": "tool_use",
                    "id": _new_id("toolu"),
                    "name": event.name,
                    "input": {},
                }
                yield from self._start("tool_use", block)
            else:
                assert isinstance(event, ArgumentsDelta)
                self._arguments.append(event.text)
                delta = {"type": "input_json_delta", "partial_json": event.text}
                yield "content_block_delta", {"index": len(self.blocks) - 1, "delta": delta}

    def _start(self, kind: str, block: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        self._kind = kind
        self.blocks.append(block)
        started = {**block, "input": {}} if kind == "tool_use" else dict(block)
        yield "content_block_start", {"index": len(self.blocks) - 1, "content_block": started}

    def _text(self, kind: str, text: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if not text:
            return
        if self._kind != kind:
            yield from self.close()
            block = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            yield from self._start(kind, block)
        block = self.blocks[-1]
        block[kind] += text
        delta = (
            {"type": "thinking_delta", "thinking": text}
            if kind == "thinking"
            else {"type": "text_delta", "text": text}
        )
        yield "content_block_delta", {"index": len(self.blocks) - 1, "delta": delta}

    def close(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Stop the block being built (the answer moved on, or ended)."""
        if not self._kind:
            return
        if self._kind == "tool_use":
            arguments = "".join(self._arguments)
            self._arguments = []
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                parsed = None
            # A call whose arguments are not a JSON object cannot be a tool_use block: it is
            # the text the model wrote.
            if isinstance(parsed, dict):
                self.blocks[-1]["input"] = parsed
            else:
                self.blocks[-1] = {"type": "text", "text": arguments}
        self._kind = ""
        yield "content_block_stop", {"index": len(self.blocks) - 1}


class MessagesServing:
    """`/v1/messages` and `/v1/messages/count_tokens`."""

    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    async def prepare(self, request: MessagesRequest) -> tuple[PreparedRequest, ChatPlan]:
        try:
            return await self.serving.prepare_chat(
                chat_request(request, self.serving), api=API_LABEL
            )
        except OpenAIError as error:
            if error.param is not None:
                head, dot, rest = error.param.partition(".")
                error.param = _PARAMS.get(head, head) + dot + rest
            raise

    def count_tokens(self, request: CountTokensRequest) -> dict[str, int]:
        chat = chat_request(request, self.serving)
        prompt = self.serving.render_chat(chat, self.serving.plan_tools(chat))
        return {"input_tokens": self.serving.count_tokens(prompt)}

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
        """The whole message."""
        content = ContentBuilder()
        last = AnswerStep([], 0)
        async with aclosing(answer_steps(self.serving.generator, prepared, plan)) as steps:
            async for last in steps:
                for _ in content.feed(last.events):
                    pass
        for _ in content.close():
            pass
        message = self._message(prepared, model, content.blocks)
        message["stop_reason"], message["stop_sequence"] = _stop(last, content.calls)
        message["usage"].update(_usage(prepared, last))
        return message

    async def stream(
        self, prepared: PreparedRequest, plan: ChatPlan, model: str
    ) -> AsyncIterator[str]:
        """Anthropic's stream of events. The first events wait for the engine's first answer,
        so a failure before it still gets an error status."""

        def event(kind: str, payload: dict[str, Any]) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n"

        content = ContentBuilder()
        async with aclosing(answer_steps(self.serving.generator, prepared, plan)) as steps:
            step = await anext(steps, None)
            yield event("message_start", {"message": self._message(prepared, model, [])})
            yield event("ping", {})
            last = AnswerStep([], 0)
            try:
                while step is not None:
                    for kind, payload in content.feed(step.events):
                        yield event(kind, payload)
                    last, step = step, await anext(steps, None)
            except EngineError as error:
                # The status was sent: the failure is the stream's last event.
                yield event("error", {"error": {"type": "api_error", "message": str(error)}})
                return
            for kind, payload in content.close():
                yield event(kind, payload)
            stop_reason, stop_sequence = _stop(last, content.calls)
            yield event(
                "message_delta",
                {
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": _usage(prepared, last),
                },
            )
            yield event("message_stop", {})


def _usage(prepared: PreparedRequest, last: AnswerStep) -> dict[str, int]:
    """Anthropic's counts: input_tokens are the prompt tokens not read from the cache."""
    cached = last.cached_tokens
    return {
        "input_tokens": len(prepared.prompt_ids) - cached,
        "cache_read_input_tokens": cached,
        "output_tokens": last.completion_tokens,
    }


def _stop(last: AnswerStep, calls: int) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence of a finished answer."""
    if last.finish_reason is FinishReason.LENGTH:
        return "max_tokens", None
    if last.stop is not None:
        return "stop_sequence", last.stop
    return ("tool_use" if calls else "end_turn"), None
