"""Streamed chat deltas of a sequence read by an :class:`~.answers.AnswerReader`, in OpenAI's
chunk shape.

Thinking goes out as `reasoning_content` and `reasoning` (the names trtllm-serve and vLLM use);
a call's first delta carries its index, id, type and name (with empty arguments); later deltas
carry pieces of its arguments; text outside calls is ordinary content.
"""

from __future__ import annotations

import json

from .answers import AnswerEvent, AnswerReader
from .reasoning import ReasoningDelta
from .tool_events import ArgumentsDelta, CallStart, ContentDelta
from .tools import new_call_id

_json = json.dumps


class ChatDeltas:
    """Turns one sequence's text pieces into the JSON of its `delta` objects."""

    def __init__(self, reader: AnswerReader) -> None:
        self._reader = reader

    @property
    def calls(self) -> int:
        """Calls started so far."""
        return self._reader.calls

    def deltas(self, text: str, final: bool = False) -> list[str]:
        """Delta objects (JSON) for a new piece of text; `final`: the sequence ended."""
        return [_delta(event) for event in self._reader.feed(text, final)]


def _delta(event: AnswerEvent) -> str:
    if isinstance(event, ContentDelta):
        return f'{{"content":{_json(event.text)}}}'
    if isinstance(event, ReasoningDelta):
        text = _json(event.text)
        return f'{{"reasoning_content":{text},"reasoning":{text}}}'
    if isinstance(event, CallStart):
        call = {
            "index": event.index,
            "id": new_call_id(),
            "type": "function",
            "function": {"name": event.name, "arguments": ""},
        }
        return f'{{"tool_calls":[{_json(call)}]}}'
    assert isinstance(event, ArgumentsDelta)
    piece = {"index": event.index, "function": {"arguments": event.text}}
    return f'{{"tool_calls":[{_json(piece)}]}}'
