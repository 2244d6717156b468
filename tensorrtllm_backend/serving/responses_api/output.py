"""A Responses answer's output items, built from its answer events, with the stream events that
announce them in OpenAI's order: an item is added, its content part is added, its deltas follow,
the text and the part are done, the item is done. A call of a client-executed built-in
(:mod:`.client_tools`) is known once its arguments are whole: its item is added and done then,
with no events between (OpenAI sends none for these items)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from ..chat.parts import AnswerParts
from ..ids import new_id
from .client_tools import call_item
from .conversion import CUSTOM_INPUT

Event = tuple[str, dict[str, Any]]  # (type, payload without type and sequence number)


class OutputBuilder(AnswerParts[Event]):
    """Output items: a `reasoning` item for the thinking, a `message` for the text, a
    `function_call` per call (a `custom_tool_call` for a custom tool, a `shell_call`,
    `local_shell_call` or `apply_patch_call` for those built-ins); `items` is the output so far.
    `namespaced`: offered name -> (namespace, function) of the functions of namespace tools,
    whose calls are reported with their namespace; `custom`: the custom tools' names;
    `summary`: reasoning items carry the thinking as their summary too; `seal`: they carry it
    encrypted too (:mod:`.sealing`); `client`: the client-executed built-ins offered."""

    def __init__(
        self,
        items: list[dict[str, Any]] | None = None,
        namespaced: dict[str, tuple[str, str]] | None = None,
        summary: bool = False,
        seal: Callable[[str], str] | None = None,
        custom: set[str] | None = None,
        client: set[str] | None = None,
    ) -> None:
        super().__init__()
        self.items: list[dict[str, Any]] = items if items is not None else []
        self.status = "completed"  # of the items closed from now on
        self.namespaced = namespaced or {}
        self.custom = custom or set()
        self.client = client or set()
        self.held = ""  # the built-in whose call is open: its item waits for the whole arguments
        self.summary = summary
        self.seal = seal  # reasoning items carry their thinking sealed too

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}

    def opened(self, kind: str, name: str | None) -> Iterator[Event]:
        if kind == "call" and name in self.client:
            self.held = str(name)
            return
        if kind == "call" and name in self.custom:
            item = {
                "type": "custom_tool_call", "id": new_id("ctc"), "call_id": new_id("call"),
                "name": name, "input": "", "status": "in_progress",
            }  # fmt: skip
        elif kind == "call":
            item = _function_call(str(name))
            if name in self.namespaced:
                item["namespace"], item["name"] = self.namespaced[name]
        elif kind == "thinking":
            item = {
                "type": "reasoning", "id": new_id("rs"), "summary": [], "content": [],
                "status": "in_progress",
            }  # fmt: skip
        else:
            item = {
                "type": "message", "id": new_id("msg"), "role": "assistant",
                "status": "in_progress", "content": [],
            }  # fmt: skip
        yield from self._added(kind, item)

    def _added(self, kind: str, item: dict[str, Any]) -> Iterator[Event]:
        self.items.append(item)
        yield "response.output_item.added", {"output_index": len(self.items) - 1, "item": item}
        if kind != "call":
            yield "response.content_part.added", {
                **self._where(), "content_index": 0, "part": _part(kind, "")
            }  # fmt: skip

    def grew(self, kind: str, text: str) -> Iterator[Event]:
        if kind == "call" and self.held:
            return  # its item is known once the arguments are whole
        if kind == "call" and self.items[-1]["type"] == "custom_tool_call":
            return  # its input is the arguments' one string: known once they are whole
        if kind == "call":
            yield "response.function_call_arguments.delta", {**self._where(), "delta": text}
        elif kind == "thinking":
            yield "response.reasoning_text.delta", {
                **self._where(), "content_index": 0, "delta": text
            }  # fmt: skip
        else:
            yield "response.output_text.delta", {
                **self._where(), "content_index": 0, "delta": text, "logprobs": []
            }  # fmt: skip

    def closed(self, kind: str, text: str) -> Iterator[Event]:
        if kind == "call" and self.held:
            yield from self._client_call(text)
            return
        item, where = self.items[-1], self._where()
        if kind == "call" and item["type"] == "custom_tool_call":
            item["input"] = custom_input(text)
            yield "response.custom_tool_call_input.delta", {**where, "delta": item["input"]}
            yield "response.custom_tool_call_input.done", {**where, "input": item["input"]}
        elif kind == "call":
            item["arguments"] = text
            yield "response.function_call_arguments.done", {**where, "arguments": text}
        else:
            part = _part(kind, text)
            item["content"] = [part]
            if kind == "thinking" and self.summary:
                item["summary"] = [{"type": "summary_text", "text": text}]
            if kind == "thinking" and self.seal is not None:
                item["encrypted_content"] = self.seal(text)
            done = (
                "response.reasoning_text.done"
                if kind == "thinking"
                else "response.output_text.done"
            )
            extra = {} if kind == "thinking" else {"logprobs": []}
            yield done, {**where, "content_index": 0, "text": text, **extra}
            yield "response.content_part.done", {**where, "content_index": 0, "part": part}
        item["status"] = self.status
        yield "response.output_item.done", {"output_index": where["output_index"], "item": item}

    def _client_call(self, arguments: str) -> Iterator[Event]:
        """A built-in's call, whole: its item; arguments that do not fit the tool's shape are
        the function call they are, as any malformed call is."""
        name, self.held = self.held, ""
        item = call_item(name, arguments)
        if item is not None:
            self.items.append(item)
            index = len(self.items) - 1
            added = {**item, "status": "in_progress"}
            yield "response.output_item.added", {"output_index": index, "item": added}
            yield "response.output_item.done", {"output_index": index, "item": item}
            return
        yield from self._added("call", _function_call(name))
        if arguments:
            yield from self.grew("call", arguments)
        yield from self.closed("call", arguments)

    def finish(self, status: str) -> Iterator[Event]:
        """Close the open item, with the answer's status (completed or incomplete)."""
        self.status = status
        yield from self.close()

    def reasoning_text(self) -> str:
        return "".join(
            part["text"]
            for item in self.items
            if item["type"] == "reasoning"
            for part in item["content"]
        )


def custom_input(arguments: str) -> str:
    """A custom tool call's input: the one string of the arguments it was offered with (the
    arguments themselves where the model wrote something else)."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get(CUSTOM_INPUT), str):
        return str(parsed[CUSTOM_INPUT])
    return arguments


def _function_call(name: str) -> dict[str, Any]:
    return {
        "type": "function_call", "id": new_id("fc"), "call_id": new_id("call"), "name": name,
        "arguments": "", "status": "in_progress",
    }  # fmt: skip


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "thinking":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
