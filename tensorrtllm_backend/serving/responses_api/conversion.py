"""A Responses request as the chat core's request: instructions as the system message, input
items and the stored conversation of `previous_response_id` as the messages, function tools (and
the tools offered as functions: namespaces, custom tools, the client-executed built-ins of
:mod:`.client_tools`), `text.format` as response_format; every refusal names the Responses
field."""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError

from ..chat.core import chat_request as to_chat
from ..chat.request import ChatRequest
from ..errors import validation_message
from ..ids import new_id
from ..request_errors import RequestError
from .client_tools import (
    CLIENT_TOOLS,
    FORCEABLE,
    history_call,
    offered_function,
    output_text,
    runs_on_openai,
)
from .protocol import (
    HOSTED_TOOLS,
    ITEM_TYPES,
    ClientCallItem,
    ClientOutputItem,
    CustomTool,
    CustomToolCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
)

logger = logging.getLogger(__name__)
# How a namespace tool's function is named to the model: `namespace__function`.
NAMESPACE_SEPARATOR = "__"
# The one argument a custom tool is offered with: its free-form input.
CUSTOM_INPUT = "input"
# Chat fields named in errors, and the Responses field they came from.
FIELDS = {
    "messages": "input",
    "response_format": "text.format",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
}


def parse_items(items: str | list[dict[str, Any]], where: str = "input") -> list[InputItem]:
    """Input items by their type (a message may leave it out); others are a 400. Each keeps its
    place (`input[2]`), which names its images in errors."""
    if isinstance(items, str):
        return [MessageItem(role="user", content=items)]
    parsed: list[InputItem] = []
    for position, item in enumerate(items):
        kind = item.get("type", "message")
        model = ITEM_TYPES.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise RequestError(
                f"{where}[{position}]: items of type {kind!r} are not supported here (messages, "
                "reasoning, and the calls of function, custom, shell, local_shell and "
                "apply_patch tools with their outputs are)",
                param=f"{where}[{position}].type",
            )
        where_item = f"{where}[{position}]"
        try:
            parsed.append(model.model_validate(item, context={"where": where_item}))
        except ValidationError as error:
            message, location = validation_message(error)
            raise RequestError(
                f"{where_item}.{message}", param=f"{where_item}.{location}" if location else None
            ) from None
    return parsed


def stored_item(item: InputItem) -> dict[str, Any]:
    """An input item as stored: with an id, as OpenAI lists input items."""
    prefixes = {
        "message": "msg",
        "function_call": "fc",
        "reasoning": "rs",
        "custom_tool_call": "ctc",
        "shell_call": "sh",
        "local_shell_call": "lsh",
        "apply_patch_call": "apc",
        "shell_call_output": "sho",
        "local_shell_call_output": "lsho",
        "apply_patch_call_output": "apco",
    }
    prefix = prefixes.get(item.type, "fco")
    return {**item.model_dump(exclude_none=True, by_alias=True), "id": item.id or new_id(prefix)}


def chat_messages(instructions: str | None, items: list[InputItem]) -> list[dict[str, Any]]:
    """The conversation as chat messages: the instructions and every system or developer message
    are the one system message, first (what chat templates take); function calls join the
    assistant message before them (a namespace's function, a custom tool or a client-executed
    built-in by the name it is offered under), their outputs are tool messages (a function's
    images among its text, where they stand), and a reasoning item is the thinking of the
    assistant message after it."""
    messages: list[dict[str, Any]] = []
    systems = [instructions] if instructions else []
    thinking = ""
    for item in items:
        if isinstance(item, ReasoningItem):
            thinking += item.text()
            continue
        if isinstance(item, FunctionCallOutputItem):  # a custom tool call's output too
            content = item.chat_content()
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": content})
            continue
        if isinstance(item, ClientOutputItem):
            messages.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": output_text(item)}
            )
            continue
        if isinstance(item, MessageItem):
            if item.role in ("system", "developer"):
                systems.append(item.text())
                continue
            messages.append({"role": item.role, "content": item.chat_content()})
        else:
            if isinstance(item, CustomToolCallItem):  # offered as a function of one string
                name, arguments = item.name, json.dumps({CUSTOM_INPUT: item.input})
            elif isinstance(item, ClientCallItem):
                name, arguments = history_call(item)
            else:
                name, arguments = offered_name(item.namespace, item.name), item.arguments
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        if messages[-1]["role"] == "assistant" and thinking:
            messages[-1]["reasoning_content"] = thinking
            thinking = ""
    if systems:
        messages.insert(0, {"role": "system", "content": "\n\n".join(systems)})
    return messages


def offered_name(namespace: str | None, name: str) -> str:
    """The name a namespace's function is offered to the model under."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def namespaced(tools: list[dict[str, Any]] | None) -> dict[str, tuple[str, str]]:
    """Offered name -> (namespace, function) of the functions of namespace tools."""
    return {
        offered_name(tool.get("name"), inner.get("name", "")): (tool["name"], inner.get("name"))
        for tool in tools or ()
        if tool.get("type") == "namespace" and isinstance(tool.get("name"), str)
        for inner in tool.get("tools") or ()
        if isinstance(inner, dict)
    }


def custom_tools(tools: list[dict[str, Any]] | None) -> set[str]:
    """The names of the custom tools (their calls are reported as custom_tool_call items)."""
    return {
        tool["name"]
        for tool in tools or ()
        if tool.get("type") == "custom" and isinstance(tool.get("name"), str)
    }


def _custom(tool: Any, where: str, forced: bool) -> dict[str, Any]:
    """A custom tool as the function the model is offered: one string argument, `input`. A
    regex format is that string's pattern, which guided decoding enforces when the call is
    forced; a lark grammar is shown to the model, and enforced nowhere (a forced call to it is
    refused)."""
    try:
        custom = CustomTool.model_validate(tool)
    except ValidationError as error:
        message, _ = validation_message(error)
        raise RequestError(f"{where}.{message}", param=where) from None
    text: dict[str, Any] = {"type": "string", "description": "the tool's input, free-form text"}
    description = custom.description or ""
    form = custom.format
    if form is not None and form.type == "grammar" and form.definition:
        if form.syntax == "regex":
            text["pattern"] = form.definition
        elif forced:
            raise RequestError(
                f"{where}: a forced call to a custom tool with a lark grammar is not enforced "
                "here (regex formats are): send tool_choice auto, or a regex format",
                param=f"{where}.format",
            )
        else:
            description += f"\n\nIts input follows this {form.syntax} grammar:\n{form.definition}"
    return {
        "name": custom.name,
        "description": description.strip() or None,
        "parameters": {
            "type": "object",
            "properties": {CUSTOM_INPUT: text},
            "required": [CUSTOM_INPUT],
            "additionalProperties": False,
        },
    }


def chat_tools(
    tools: list[dict[str, Any]] | None, hosted: str = "omit", forced: str | None = None
) -> list[dict[str, Any]] | None:
    """The function tools the model is offered: function tools, the functions of namespace
    tools under their offered names, custom tools as functions of one string (`forced`: the
    name of the tool a call is forced to), and the client-executed built-ins as functions of
    their type's name. Tools that run on OpenAI's side are left out with a log line (`hosted`
    "omit", TRTLLM_HOSTED_TOOLS) or refused ("reject"); other types are refused."""
    if tools is None:
        return None
    converted = []
    for position, tool in enumerate(tools):
        kind = tool.get("type")
        if kind == "namespace":
            for inner, function in enumerate(tool.get("tools") or ()):
                where = f"tools[{position}].tools[{inner}]"
                offered = _function(function, where)
                offered["name"] = offered_name(tool.get("name"), offered["name"])
                converted.append({"type": "function", "function": offered})
            continue
        if kind in HOSTED_TOOLS and hosted == "omit":
            _omitted(str(kind))
            continue
        if runs_on_openai(tool):
            if hosted == "omit":
                _omitted("shell (in a container)")
                continue
            raise RequestError(
                f"tools[{position}]: a shell tool in one of OpenAI's containers runs on OpenAI's "
                'side: send it without environment, or with {"type": "local"}, to run its '
                "calls yourself (or leave it out with TRTLLM_HOSTED_TOOLS=omit)",
                param=f"tools[{position}].environment",
            )
        if kind in CLIENT_TOOLS:
            offered = offered_function(tool, f"tools[{position}]")
            converted.append({"type": "function", "function": offered})
            continue
        if kind == "custom":
            where = f"tools[{position}]"
            offered = _custom(tool, where, forced is not None and tool.get("name") == forced)
            converted.append({"type": "function", "function": offered})
            continue
        if kind != "function":
            raise RequestError(
                f"tools[{position}]: {kind!r} tools are not supported: this server runs the "
                "model only, so it offers function, namespace and custom tools, and the "
                "built-ins the client runs: shell, local_shell, apply_patch (tools that run on "
                "OpenAI's side are left out with TRTLLM_HOSTED_TOOLS=omit)",
                param=f"tools[{position}].type",
            )
        converted.append({"type": "function", "function": _function(tool, f"tools[{position}]")})
    return converted or None


def _function(tool: Any, where: str) -> dict[str, Any]:
    try:
        function = FunctionTool.model_validate(tool)
    except ValidationError as error:
        message, _ = validation_message(error)
        raise RequestError(f"{where}.{message}", param=where) from None
    return function.model_dump(exclude={"type"}, exclude_none=True)


_OMITTED: set[str] = set()


def _omitted(kind: str) -> None:
    """Log once per tool type that requests offer it and the model is not shown it."""
    if kind not in _OMITTED and len(_OMITTED) < 64:
        _OMITTED.add(kind)
        logger.warning(
            "/v1/responses: leaving out %r tools: they run on OpenAI's side (TRTLLM_HOSTED_TOOLS)",
            kind,
        )


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") in ("function", "custom")
        and "name" in choice
    ):
        return {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(choice, dict) and choice.get("type") in FORCEABLE:
        return {"type": "function", "function": {"name": choice["type"]}}  # offered by its type
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise RequestError(
        f"tool_choice {kind!r} is not supported: send none, auto, required, "
        '{"type": "function" or "custom", "name": ...}, {"type": "shell"} or '
        '{"type": "apply_patch"}',
        param="tool_choice",
    )


def _forced_name(choice: str | dict[str, Any] | None) -> str | None:
    if isinstance(choice, dict) and choice.get("type") in FORCEABLE:
        return str(choice["type"])
    return choice.get("name") if isinstance(choice, dict) else None


def chat_request(
    request: ResponsesRequest, items: list[InputItem], hosted: str = "omit"
) -> ChatRequest:
    """The chat request a Responses request is served as (`hosted`: TRTLLM_HOSTED_TOOLS)."""
    template = dict(request.chat_template_kwargs or {})
    if request.reasoning is not None and request.reasoning.effort is not None:
        template.setdefault("reasoning_effort", request.reasoning.effort)
    values: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(request.instructions, items),
        "stream": request.stream,
        "max_completion_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "tools": chat_tools(request.tools, hosted, _forced_name(request.tool_choice)),
        "tool_choice": chat_tool_choice(request.tool_choice),
        "seed": request.seed,
        "top_k": request.top_k,
        "min_tokens": request.min_tokens,
        "repetition_penalty": request.repetition_penalty,
        "ignore_eos": request.ignore_eos,
        "chat_template_kwargs": template or None,
    }
    if request.parallel_tool_calls is not None:
        values["parallel_tool_calls"] = request.parallel_tool_calls
    text_format = request.text.format if request.text else None
    # A forced call answers with the call alone: there is no text for the format to shape (the
    # Agents SDK sends both when an agent with an output type must call a tool first).
    forced = values["tool_choice"] not in (None, "none", "auto")
    if text_format is not None and text_format.type != "text" and not forced:
        spec = {"type": text_format.type}
        if text_format.type == "json_schema":
            spec["json_schema"] = {  # type: ignore[assignment]
                "name": text_format.name,
                "schema": text_format.json_schema,
                "strict": text_format.strict,
            }
        values["response_format"] = spec
    return to_chat(values, FIELDS)
