"""The vocabulary of an answer as it is read: the pieces of text the reasoning splitter
(:mod:`.reasoning`), the tool-call parsers (:mod:`.tool_parsers`) and the forced-call extractors
(:mod:`.tools`) report, which every API's renderer turns into its own events."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Text outside any call and outside the thinking: the message's content."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Text of the model's thinking."""

    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    """Call `index` begins; its name is complete."""

    index: int
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    """The next piece of call `index`'s arguments, as raw JSON text."""

    index: int
    text: str


Event = ContentDelta | CallStart | ArgumentsDelta
"""What a tool-call parser reports."""

AnswerEvent = ReasoningDelta | ContentDelta | CallStart | ArgumentsDelta
"""What reading an answer reports."""
