"""Streamed chat deltas of a sequence that may call tools, in OpenAI's chunk shape.

A call's first delta carries its index, id, type and name (with empty arguments); later deltas
carry pieces of its arguments; text outside calls is ordinary content.
"""

from __future__ import annotations

import json

from .tool_events import ArgumentsDelta, CallStart, ContentDelta, Event
from .tools import CallExtractor, new_call_id

_json = json.dumps


class ToolStream:
    """Turns one sequence's text pieces into the JSON of its `delta` objects."""

    def __init__(self, extractor: CallExtractor) -> None:
        self._extractor = extractor
        self.calls = 0  # calls started so far

    def deltas(self, text: str, final: bool = False) -> list[str]:
        """Delta objects (JSON) for a new piece of text; `final`: the sequence ended."""
        events = self._extractor.feed(text) if text else []
        if final:
            events += self._extractor.finish()
        return [self._delta(event) for event in events]

    def _delta(self, event: Event) -> str:
        if isinstance(event, ContentDelta):
            return f'{{"content":{_json(event.text)}}}'
        if isinstance(event, CallStart):
            self.calls += 1
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
