"""An Anthropic Messages request as the chat core's request.

System text, wherever it stands (the top-level `system`, and system messages among the others as
Claude Code sends them), is the conversation's one system message, in order: chat templates take
it first. A user turn's tool results come first, as tool messages (a result's images among its
text, where they stand); an assistant turn's tool_use blocks are its tool calls, its thinking the
message's reasoning. Errors name each image by its block (`messages.3.content.0.content.1`).
Tools marked `defer_loading` stay out of the prompt until a `tool_reference` block in a tool
result loads them. `thinking` adaptive is the model's own choice (the template's default),
disabled turns a thinking model's template off, enabled asks a model that thinks;
`output_config.effort` is the chat template's `reasoning_effort` variable (a template without one
ignores it).
"""

from __future__ import annotations

import json
from typing import Any

from ..chat.core import ChatCore
from ..chat.core import chat_request as to_chat
from ..chat.images import image_part
from ..chat.request import ChatRequest
from ..request_errors import RequestError
from .protocol import (
    CountTokensRequest,
    ImageBlock,
    Message,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    Tool,
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
    """The conversation as chat messages (see the module's docstring)."""
    converted: list[dict[str, Any]] = []
    systems = [system] if system else []
    for m, message in enumerate(messages):
        blocks = (
            [TextBlock(type="text", text=message.content)]
            if isinstance(message.content, str)
            else message.content
        )
        text = "".join(block.text for block in blocks if isinstance(block, TextBlock))
        if message.role == "system":
            if text:
                systems.append(text)
            continue
        if message.role == "user":
            where = f"messages.{m}.content"
            for b, block in enumerate(blocks):
                if isinstance(block, ToolResultBlock):
                    content = tool_content(block, f"{where}.{b}")
                    converted.append(
                        {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}
                    )
            if any(isinstance(block, ImageBlock) for block in blocks):
                converted.append({"role": "user", "content": chat_parts(blocks, where)})
            elif text or not any(isinstance(block, ToolResultBlock) for block in blocks):
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
    if systems:
        converted.insert(0, {"role": "system", "content": "\n\n".join(systems)})
    return converted


def chat_parts(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """Text and image blocks as OpenAI's content parts, in their order (`where`: the blocks'
    place, which names each image)."""
    parts: list[dict[str, Any]] = []
    for b, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append(image_part(block.source.url_of(), f"{where}.{b}"))
    return parts


def tool_content(block: ToolResultBlock, where: str) -> str | list[dict[str, Any]]:
    """A tool result as its tool message's content: its text, or its text and images as parts
    where it holds images (an error's text marked as :meth:`ToolResultBlock.text` marks it)."""
    content = block.content
    if not isinstance(content, list) or not any(isinstance(b, ImageBlock) for b in content):
        return block.text()
    parts = chat_parts(content, f"{where}.content")
    return [{"type": "text", "text": "Error: "}, *parts] if block.is_error else parts


def offered_tools(request: CountTokensRequest) -> list[Tool]:
    """The tools the prompt shows: all but the deferred ones no tool result has loaded."""
    tools = request.tools or []
    if not any(tool.defer_loading for tool in tools):
        return tools
    loaded = {
        name
        for message in request.messages
        if not isinstance(message.content, str)
        for block in message.content
        if isinstance(block, ToolResultBlock)
        for name in block.loaded_tools()
    }
    return [tool for tool in tools if not tool.defer_loading or tool.name in loaded]


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
            for tool in offered_tools(request)
        ] or None
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
    template: dict[str, Any] = {}
    thinking = request.thinking.type if request.thinking is not None else None
    if thinking == "enabled" and core.reasoning_format is None:
        raise RequestError(
            "thinking: this model does not think (no reasoning format; see "
            'TRTLLM_REASONING_PARSER): send thinking "adaptive" or "disabled"',
            param="thinking",
        )
    if thinking in ("enabled", "disabled") and core.reasoning_format is not None:
        template["enable_thinking"] = thinking == "enabled"
    if thinking == "enabled" and request.thinking is not None:
        values["thinking_budget"] = request.thinking.budget_tokens or None
    effort = request.output_config.effort if request.output_config else None
    if effort is not None:
        template["reasoning_effort"] = effort
    if template:
        values["chat_template_kwargs"] = template
    output = request.output_config.format if request.output_config else None
    # A forced call answers with the call alone: there is no text for the format to shape.
    forced = values.get("tool_choice") not in (None, "none", "auto")
    if output is not None and not forced:
        values["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": output.json_schema},
        }
    if isinstance(request, MessagesRequest):  # count_tokens sends no sampling fields
        values |= {
            "max_completion_tokens": request.max_tokens, "stop": request.stop_sequences,
            "temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k,
            "stream": request.stream,
        }  # fmt: skip
    return to_chat(values, FIELDS)
