"""Chat answer events in OpenAI's chunk shape: the JSON of a chunk's `delta` object.

Thinking goes out as `reasoning_content` and `reasoning` (the names trtllm-serve and vLLM use);
a call's first delta carries its index, id, type and name (with empty arguments); later deltas
carry pieces of its arguments; text outside calls is ordinary content.
"""

from __future__ import annotations

import json

from ..chat.events import AnswerEvent, ArgumentsDelta, CallStart, ContentDelta, ReasoningDelta
from ..ids import new_id

_json = json.dumps


def delta_json(event: AnswerEvent) -> str:
    """The `delta` object of one answer event."""
    if isinstance(event, ContentDelta):
        return f'{{"content":{_json(event.text)}}}'
    if isinstance(event, ReasoningDelta):
        text = _json(event.text)
        return f'{{"reasoning_content":{text},"reasoning":{text}}}'
    if isinstance(event, CallStart):
        call = {
            "index": event.index,
            "id": new_id("call"),
            "type": "function",
            "function": {"name": event.name, "arguments": ""},
        }
        return f'{{"tool_calls":[{_json(call)}]}}'
    assert isinstance(event, ArgumentsDelta)
    piece = {"index": event.index, "function": {"arguments": event.text}}
    return f'{{"tool_calls":[{_json(piece)}]}}'
