"""Reading a generated answer back: its reasoning, its content and its tool calls.

Chat completions (whole and streamed), the Responses API and Anthropic Messages all read the
model's text with :class:`AnswerReader`: the reasoning splitter first (:mod:`.reasoning`), then
the tool-call extractor of the request's plan (:mod:`.tools`) on the content only, so a call
inside the thinking is not a call. A whole answer is the same reader fed the whole text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .events import AnswerEvent, ContentDelta, ReasoningDelta
from .reasoning import Opening, ReasoningFormat, ReasoningSplitter
from .request import ToolCall
from .tools import CallExtractor, ToolPlan, assemble


@dataclass(frozen=True, slots=True)
class ReasoningPlan:
    """The served model's reasoning format and how this answer begins."""

    fmt: ReasoningFormat
    opening: Opening


@dataclass(frozen=True)
class ChatPlan:
    """How a chat answer is read back: its tools and its reasoning."""

    tools: ToolPlan = field(default_factory=lambda: ToolPlan("none"))
    reasoning: ReasoningPlan | None = None
    # Tokens the thinking may take before its end marker is written for it (None: no cap).
    thinking_budget: int | None = None

    @property
    def reads_text(self) -> bool:
        """Whether the text needs reading at all (else it is all content)."""
        return self.tools.parses_calls or self.reasoning is not None

    def reader(self) -> AnswerReader:
        """A fresh reader for one generated sequence."""
        splitter = None
        if self.reasoning is not None:
            splitter = self.reasoning.fmt.splitter(self.reasoning.opening)
        calls = self.tools.parser() if self.tools.parses_calls else None
        return AnswerReader(splitter, calls)


class AnswerReader:
    """The events of one generated sequence, fed piece by piece."""

    def __init__(self, splitter: ReasoningSplitter | None, calls: CallExtractor | None) -> None:
        self._splitter = splitter
        self._calls = calls

    @property
    def reasoning(self) -> bool:
        """Whether the text so far ends inside the thinking."""
        return self._splitter is not None and self._splitter.reasoning

    def feed(self, text: str, final: bool = False) -> list[AnswerEvent]:
        """Events for a new piece of text; `final`: the sequence ended."""
        split: list[ReasoningDelta | ContentDelta] = []
        if self._splitter is None:
            if text:
                split.append(ContentDelta(text))
        else:
            split = self._splitter.feed(text) if text else []
            if final:
                split += self._splitter.finish()
        events: list[AnswerEvent] = []
        for event in split:
            if isinstance(event, ContentDelta) and self._calls is not None:
                events += self._calls.feed(event.text)
            else:
                events.append(event)
        if final and self._calls is not None:
            events += self._calls.finish()
        return events


@dataclass
class Answer:
    """A whole answer: the message's reasoning, content and tool calls."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]

    @classmethod
    def of(cls, events: list[AnswerEvent]) -> Answer:
        """The answer a sequence's events make."""
        thinking = [event.text for event in events if isinstance(event, ReasoningDelta)]
        assembled = assemble([event for event in events if not isinstance(event, ReasoningDelta)])
        return cls("".join(thinking) if thinking else None, assembled.content, assembled.tool_calls)
