"""A sequence's chat deltas as the OpenAI chat stream sends them: its reader's events, each the
JSON of one `delta` object, and the calls started so far (shared by the tool and reasoning
tests)."""

from __future__ import annotations

from tensorrtllm_backend.serving.chat.answer import AnswerReader
from tensorrtllm_backend.serving.chat.events import CallStart
from tensorrtllm_backend.serving.openai_api.chat_deltas import delta_json


class Deltas:
    def __init__(self, reader: AnswerReader) -> None:
        self.reader = reader
        self.calls = 0

    def deltas(self, text: str, final: bool = False) -> list[str]:
        events = self.reader.feed(text, final)
        self.calls += sum(isinstance(event, CallStart) for event in events)
        return [delta_json(event) for event in events]
