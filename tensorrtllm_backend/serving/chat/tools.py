"""Tool calling on /v1/chat/completions: which calls a request allows, the guide that makes a
forced call valid, and the tool calls read back from the generated text.

* ``tool_choice`` "none": the tools are shown to the chat template, no call is read back.
* "auto" (the default with tools): the model answers freely; calls are parsed from its text in
  its own format (:mod:`.tool_parsers`), so the format must be known.
* "required": the answer is guided by a JSON schema: an array of call objects, ``anyOf`` over the
  tools (one call unless ``parallel_tool_calls``), so it is always a valid call.
* a named function: the answer is guided by that function's parameter schema; it is the call's
  arguments.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..ids import new_id
from ..request_errors import RequestError
from ..schemas import GuidedDecoding
from .events import ArgumentsDelta, CallStart, ContentDelta, Event
from .images import IMAGE_PART, template_content
from .output_format import make_guide
from .request import ChatRequest, NamedToolChoice, Tool, ToolCall, ToolCallFunction
from .tool_parsers import JSON_CALLS, ToolCallFormat, ToolCallParser

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def parameters(tool: Tool) -> dict[str, Any]:
    """A function's parameter schema (OpenAI: omitted means no parameters)."""
    return tool.function.parameters or EMPTY_PARAMETERS


@dataclass(frozen=True)
class ToolPlan:
    """What a chat request does with its tools."""

    mode: str  # "none" | "auto" | "required" | "named"
    tools: list[Tool] = field(default_factory=list)
    fmt: ToolCallFormat | None = None  # the model's format ("auto")
    named: str | None = None
    guide: GuidedDecoding | None = None

    @property
    def parses_calls(self) -> bool:
        return self.mode != "none"

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as chat templates take them (OpenAI's own shape)."""
        if not self.tools:
            return None
        return [
            {"type": "function", "function": tool.function.model_dump(exclude_none=True)}
            for tool in self.tools
        ]

    def parser(self) -> CallExtractor:
        """A fresh extractor for one generated sequence."""
        if self.mode == "named":
            assert self.named is not None
            return _NamedCall(self.named)
        if self.mode == "required":
            return _Forced(ToolCallParser(JSON_CALLS, calls_first=True))
        assert self.fmt is not None
        return _Parsed(ToolCallParser(self.fmt))


def plan_tools(
    request: ChatRequest, fmt: ToolCallFormat | None, template_renders_tools: bool
) -> ToolPlan:
    """Check `tools` / `tool_choice` and decide how the request is answered."""
    tools = request.tools or []
    choice = request.tool_choice
    names = [tool.function.name for tool in tools]
    duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicates:
        raise RequestError(f"tool names must be unique: {', '.join(duplicates)}", param="tools")
    if choice is None:
        choice = "auto" if tools else "none"
    if not tools:
        if choice != "none":
            raise RequestError(
                "tool_choice needs tools: send the functions it may call", param="tool_choice"
            )
        return ToolPlan("none")
    if not template_renders_tools:
        raise RequestError(
            "this model's chat template does not render tools, so the model would not see them: "
            "send the request without tools, or pack a tokenizer whose chat template has them",
            param="tools",
        )
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in names:
            raise RequestError(
                f"tool_choice names {name!r}, which is not among the tools "
                f"({', '.join(repr(n) for n in names)})",
                param="tool_choice",
            )
        schema = parameters(tools[names.index(name)])
        return ToolPlan("named", tools, named=name, guide=_json_schema_guide(schema, "tool_choice"))
    if choice == "none":
        return ToolPlan("none", tools)
    if choice == "required":
        arguments_key = fmt.arguments_key if fmt is not None else "arguments"
        schema = calls_schema(tools, arguments_key, request.parallel_tool_calls)
        return ToolPlan("required", tools, guide=_json_schema_guide(schema, "tools"))
    if fmt is None:
        raise RequestError(
            "tool_choice \"auto\" reads calls in the model's own format, and this model's chat "
            "template writes none that is known (hermes, llama3_json, mistral; name one with "
            'TRTLLM_TOOL_PARSER): send tool_choice "required" or {"type": "function", '
            '"function": {"name": ...}}',
            param="tool_choice",
        )
    return ToolPlan("auto", tools, fmt=fmt)


def calls_schema(tools: list[Tool], arguments_key: str, parallel: bool) -> dict[str, Any]:
    """JSON schema of a "required" answer: an array of calls, each one of the tools."""
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool.function.name},
                arguments_key: parameters(tool),
            },
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    call = variants[0] if len(variants) == 1 else {"anyOf": variants}
    schema: dict[str, Any] = {"type": "array", "items": call, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _json_schema_guide(schema: dict[str, Any], param: str) -> GuidedDecoding:
    return make_guide("json_schema", json.dumps(schema), param)


def history_message(message: Any, images: bool = False) -> dict[str, Any]:
    """A chat message as chat templates take it: assistant tool calls with their arguments as
    objects (what templates render with `tojson`), tool results with their call id. With
    `images` (a model that takes them), a message holding images keeps its parts, each image
    as the template's image part."""
    content = message.content
    if images and isinstance(content, list) and any(p.get("type") == IMAGE_PART for p in content):
        text: Any = template_content(content)
    else:
        text = message.text()
    rendered: dict[str, Any] = {"role": message.role, "content": text}
    if message.name is not None:
        rendered["name"] = message.name
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        rendered["tool_calls"] = [_history_call(call) for call in message.tool_calls]
    thinking = getattr(message, "reasoning_content", None) or getattr(message, "reasoning", None)
    if thinking:
        rendered["reasoning_content"] = thinking  # what templates of thinking models read
    return rendered


def _history_call(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        raise ValueError(
            f"tool call {call.id!r}: function.arguments is not valid JSON: "
            f"{call.function.arguments[:80]!r}"
        ) from None
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": arguments},
    }


# --- reading calls back ---------------------------------------------------------------------------


class CallExtractor:
    """Tool-call events of one generated sequence, fed piece by piece."""

    def feed(self, text: str) -> list[Event]:
        raise NotImplementedError

    def finish(self) -> list[Event]:
        raise NotImplementedError


class _Parsed(CallExtractor):
    def __init__(self, parser: ToolCallParser) -> None:
        self._parser = parser

    def feed(self, text: str) -> list[Event]:
        return self._parser.feed(text)

    def finish(self) -> list[Event]:
        return self._parser.finish()


class _Forced(_Parsed):
    """A "required" tool_choice: the guide allows only calls, so text outside them is the rest
    of a call the token limit cut short: never the message's content."""

    def feed(self, text: str) -> list[Event]:
        return [e for e in self._parser.feed(text) if not isinstance(e, ContentDelta)]

    def finish(self) -> list[Event]:
        return [e for e in self._parser.finish() if not isinstance(e, ContentDelta)]


class _NamedCall(CallExtractor):
    """A named tool_choice: the whole answer is the arguments of that one call."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._started = False

    def _start(self) -> list[Event]:
        if self._started:
            return []
        self._started = True
        return [CallStart(0, self._name)]

    def feed(self, text: str) -> list[Event]:
        events = self._start()
        if text:
            events.append(ArgumentsDelta(0, text))
        return events

    def finish(self) -> list[Event]:
        return self._start()


@dataclass
class AssembledCalls:
    """The events of a whole sequence gathered into a message's content and tool calls."""

    content: str | None
    tool_calls: list[ToolCall]


def assemble(events: list[Event]) -> AssembledCalls:
    content: list[str] = []
    calls: dict[int, tuple[str, list[str]]] = {}
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, CallStart):
            calls[event.index] = (event.name, [])
        else:
            calls[event.index][1].append(event.text)
    text = "".join(content)
    return AssembledCalls(
        text if text or not calls else None,
        [
            ToolCall(
                id=new_id("call"),
                function=ToolCallFunction(name=name, arguments="".join(pieces)),
            )
            for name, pieces in (calls[index] for index in sorted(calls))
        ],
    )


def extract_calls(plan: ToolPlan, text: str) -> AssembledCalls:
    """Content and tool calls of a whole generated text."""
    extractor = plan.parser()
    return assemble(extractor.feed(text) + extractor.finish())
