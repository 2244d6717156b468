"""What a tool-call parser reports as generated text arrives: the vocabulary between the parsers
(:mod:`.tool_parsers`), the forced-call extractors (:mod:`.tools`) and the streamed deltas
(:mod:`.tool_stream`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Text outside any call: the message's content."""

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
