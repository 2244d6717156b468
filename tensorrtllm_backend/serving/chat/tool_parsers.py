"""Tool calls in generated text, for the tool-call formats of the common model families.

A :class:`ToolCallParser` is fed the generated text piece by piece and returns events
(:mod:`.tool_events`): content text, the start of a call (once its name is complete) and pieces
of the call's arguments (the raw JSON text as it arrives). A non-streamed answer is the same parser fed the whole text, so streamed
and whole answers agree by construction.

Formats (the call object is ``{"name": ..., "arguments": {...}}``; ``parameters`` is accepted for
``arguments`` everywhere):

* ``hermes`` (Hermes, Qwen 2/2.5/3): ``<tool_call>{...}</tool_call>``, one block per call;
* ``llama3_json`` (Llama 3.1-3.3): ``{"name": ..., "parameters": {...}}`` as the whole answer,
  possibly after ``<|python_tag|>``, several separated by ``;``;
* ``mistral``: ``[TOOL_CALLS][{...}, {...}]``;
* ``json``: a bare JSON array (or object) of calls, what a guided ``tool_choice`` produces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .events import ArgumentsDelta, CallStart, ContentDelta, Event

__all__ = [
    "FORMATS",
    "JSON_CALLS",
    "ArgumentsDelta",
    "CallStart",
    "ContentDelta",
    "Event",
    "ToolCallFormat",
    "ToolCallParser",
    "detect_format",
]


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    """How one model family writes tool calls."""

    name: str
    markers: tuple[str, ...]  # text that starts the calls
    separators: tuple[str, ...]  # text skipped between call objects
    arguments_key: str = "arguments"  # the key the model's own format uses
    leading_json: bool = False  # an answer that starts with "{" is a call
    template_signs: tuple[str, ...] = ()  # chat-template text that identifies the format


FORMATS: dict[str, ToolCallFormat] = {
    "hermes": ToolCallFormat(
        "hermes",
        markers=("<tool_call>",),
        separators=("<tool_call>", "</tool_call>"),
        template_signs=("<tool_call>",),
    ),
    "mistral": ToolCallFormat(
        "mistral",
        markers=("[TOOL_CALLS]",),
        separators=("[TOOL_CALLS]", "[", "]", ","),
        template_signs=("[TOOL_CALLS]",),
    ),
    "llama3_json": ToolCallFormat(
        "llama3_json",
        markers=("<|python_tag|>",),
        separators=("<|python_tag|>", ";"),
        arguments_key="parameters",
        leading_json=True,
        template_signs=("<|python_tag|>", "ipython"),
    ),
}
# The guided answer of tool_choice "required": a JSON array of calls.
JSON_CALLS = ToolCallFormat("json", markers=(), separators=("[", "]", ","))
ARGUMENT_KEYS = ("arguments", "parameters")


def detect_format(chat_template: str | dict[str, str] | None) -> ToolCallFormat | None:
    """The tool-call format a chat template renders, recognised by its marker text."""
    if isinstance(chat_template, dict):
        chat_template = "\n".join(chat_template.values())
    if not chat_template:
        return None
    for fmt in FORMATS.values():
        if any(sign in chat_template for sign in fmt.template_signs):
            return fmt
    return None


class _CallObject:
    """One JSON call object scanned as it arrives: its name once complete, then its arguments'
    raw text in pieces (held until the name is known)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.text = ""
        self._pos = 0
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._expect = "key"  # key | key_string | colon | value | in_value | after
        self._mark = 0  # where the current key or value started
        self._key: str | None = None
        self.name: str | None = None
        self._arguments: tuple[int, bool] | None = None  # (start, is a string) while scanning
        self._arguments_text: str | None = None  # complete
        self._sent = 0  # arguments characters sent
        self.started = False
        self.closed = False
        self.invalid = False

    def feed(self, text: str) -> tuple[list[Event], str]:
        """Events for the new text, and the text left after the object closed."""
        self.text += text
        end = self._scan()
        events = self._events()
        rest = self.text[end:] if self.closed or self.invalid else ""
        if self.closed or self.invalid:
            self.text = self.text[:end]
        return events, rest

    def _scan(self) -> int:
        text = self.text
        i = self._pos
        while i < len(text) and not self.closed and not self.invalid:
            c = text[i]
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._in_string = False
                    if self._depth == 1 and self._expect == "key_string":
                        self._key = _loads(text[self._mark : i + 1])
                        self._expect = "colon"
            elif c == '"':
                self._in_string = True
                if self._depth == 1 and self._expect == "key":
                    self._mark, self._expect = i, "key_string"
                elif self._depth == 1 and self._expect == "value":
                    self._begin_value(i, is_string=True)
            elif c in "{[":
                if self._depth == 0 and (c != "{" or i != 0):
                    self.invalid = True
                elif self._depth == 1 and self._expect == "value":
                    self._begin_value(i, is_string=False)
                elif self._depth == 1 and self._expect != "in_value":
                    self.invalid = True
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    if self._expect == "in_value":
                        self._end_value(i)
                    self.closed = True
            elif self._depth == 1:
                if c == ":" and self._expect == "colon":
                    self._expect = "value"
                elif c == "," and self._expect == "in_value":
                    self._end_value(i)
                    self._expect = "key"
                elif c.isspace() or self._expect == "in_value":
                    pass
                elif self._expect == "value":  # a number, true, false or null
                    self._begin_value(i, is_string=False)
                else:
                    self.invalid = True
            elif self._depth == 0 and not c.isspace():
                self.invalid = True
            i += 1
        self._pos = i
        return i

    def _begin_value(self, i: int, is_string: bool) -> None:
        self._mark, self._expect = i, "in_value"
        if self._key in ARGUMENT_KEYS and self._arguments_text is None:
            self._arguments = (i, is_string)

    def _end_value(self, i: int) -> None:
        raw = self.text[self._mark : i].rstrip()
        if self._key == "name":
            name = _loads(raw)
            if isinstance(name, str) and name:
                self.name = name
            else:
                self.invalid = True
        elif self._arguments is not None and self._key in ARGUMENT_KEYS:
            start, is_string = self._arguments
            if is_string:  # arguments sent as a JSON string holding JSON
                decoded = _loads(raw)
                self._arguments_text = decoded if isinstance(decoded, str) else raw
            else:
                self._arguments_text = raw
            self._arguments = None
        self._expect = "after"

    def _events(self) -> list[Event]:
        events: list[Event] = []
        if self.invalid:
            return events
        if not self.started and self.name is not None:
            self.started = True
            events.append(CallStart(self.index, self.name))
        if not self.started:
            return events
        if self._arguments_text is not None:
            piece = self._arguments_text[self._sent :]
        elif self._arguments is not None and not self._arguments[1]:
            start = self._arguments[0]
            piece = self.text[start : self._pos].rstrip()[self._sent :]
        elif self.closed:  # a call without arguments
            self._arguments_text = "{}"
            piece = "{}"
        else:
            piece = ""
        if piece:
            self._sent += len(piece)
            events.append(ArgumentsDelta(self.index, piece))
        return events


def _loads(raw: str) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return None


class ToolCallParser:
    """Splits one generated sequence into content and tool calls, incrementally."""

    def __init__(self, fmt: ToolCallFormat, calls_first: bool = False) -> None:
        self.fmt = fmt
        self._buffer = ""
        self._state = "between" if calls_first else "content"
        self._leading = True  # no content sent yet
        self._call: _CallObject | None = None
        self.calls = 0

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while True:
            before = (self._state, len(self._buffer))
            if self._state == "content":
                events += self._content()
            elif self._state == "between":
                self._between()
            elif self._state == "call":
                events += self._in_call()
            else:  # "text": everything after a broken call is content
                events += self._emit(self._buffer)
                self._buffer = ""
            if (self._state, len(self._buffer)) == before:
                return events

    def finish(self) -> list[Event]:
        """Events for text held back when the sequence ended."""
        events: list[Event] = []
        call = self._call
        if self._state == "call" and call is not None and not call.started:
            events.append(ContentDelta(call.text))  # never became a call: it is text
        elif self._state != "call" and self._buffer.strip():
            events.append(ContentDelta(self._buffer))
        self._buffer = ""
        self._call = None
        return events

    def _content(self) -> list[Event]:
        buffer = self._buffer
        if self._leading and self.fmt.leading_json:
            stripped = buffer.lstrip()
            if not stripped:
                return []
            if stripped.startswith("{"):
                self._buffer = stripped
                self._state = "between"
                return []
        found = [(buffer.find(m), m) for m in self.fmt.markers if m in buffer]
        if found:
            at, marker = min(found)
            self._buffer = buffer[at + len(marker) :]
            self._state = "between"
            return self._emit(buffer[:at].rstrip())
        cut = len(buffer) - _partial_marker(buffer, self.fmt.markers)
        while cut > 0 and buffer[cut - 1].isspace():
            cut -= 1
        self._buffer = buffer[cut:]
        return self._emit(buffer[:cut])

    def _emit(self, text: str) -> list[Event]:
        if not text:
            return []
        self._leading = False
        return [ContentDelta(text)]

    def _between(self) -> None:
        stripped = self._buffer.lstrip()
        for separator in self.fmt.separators:
            if stripped.startswith(separator):
                self._buffer = stripped[len(separator) :]
                return
        if stripped.startswith("{"):
            self._buffer = stripped
            self._call = _CallObject(self.calls)
            self._state = "call"
        elif stripped and not any(s.startswith(stripped) for s in self.fmt.separators):
            self._state = "content"  # text after the calls

    def _in_call(self) -> list[Event]:
        call = self._call
        assert call is not None
        events, rest = call.feed(self._buffer)
        self._buffer = ""
        if call.invalid:
            # Not a call after all: its text is content (a call already announced keeps the
            # arguments sent), and so is everything after it.
            self._state, self._buffer, self._call = "text", rest, None
            if not call.started:
                events.append(ContentDelta(call.text))
            return events
        if call.closed:
            if call.started:
                self.calls += 1
            else:
                events.append(ContentDelta(call.text))
            self._state, self._buffer, self._call = "between", rest, None
        return events


def _partial_marker(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that could begin a marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest
