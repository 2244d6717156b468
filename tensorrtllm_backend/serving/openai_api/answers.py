"""Reading a generated answer back: its reasoning, its content and its tool calls.

Chat completions (whole and streamed), the Responses API and Anthropic Messages all read the
model's text with :class:`AnswerReader`: the reasoning splitter first (:mod:`.reasoning`), then
the tool-call extractor of the request's plan (:mod:`.tools`) on the content only, so a call
inside the thinking is not a call. A whole answer is the same reader fed the whole text.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ...common.engine_api import EngineError
from ..generation import Generator, PreparedRequest
from ..schemas import FinishReason
from .protocol import ToolCall
from .reasoning import Opening, ReasoningDelta, ReasoningFormat, ReasoningSplitter
from .tool_events import ArgumentsDelta, CallStart, ContentDelta
from .tools import CallExtractor, ToolPlan, assemble

AnswerEvent = ReasoningDelta | ContentDelta | CallStart | ArgumentsDelta
T = TypeVar("T")


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
        self.calls = 0  # calls started so far

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
        self.calls += sum(isinstance(event, CallStart) for event in events)
        return events


class AnswerParts(Generic[T]):
    """An answer's parts as its events arrive: its thinking, its text and each tool call. A part
    opens, grows and closes; a subclass renders each of these as its API's events (T), and
    builds the API's answer object from them."""

    def __init__(self) -> None:
        self.part = ""  # the open part: thinking | text | call ("" when none)
        self.text: list[str] = []  # the open part's text (a call's: its arguments)

    def feed(self, events: list[AnswerEvent]) -> Iterator[T]:
        for event in events:
            if isinstance(event, CallStart):
                yield from self.close()
                yield from self._open("call", event.name)
            elif isinstance(event, ArgumentsDelta):
                self.text.append(event.text)
                yield from self.grew("call", event.text)
            elif event.text:
                kind = "thinking" if isinstance(event, ReasoningDelta) else "text"
                if self.part != kind:
                    yield from self.close()
                    yield from self._open(kind, None)
                self.text.append(event.text)
                yield from self.grew(kind, event.text)

    def _open(self, kind: str, name: str | None) -> Iterator[T]:
        self.part, self.text = kind, []
        yield from self.opened(kind, name)

    def close(self) -> Iterator[T]:
        """Close the open part (the answer moved on, or ended)."""
        if not self.part:
            return
        kind, text = self.part, "".join(self.text)
        self.part, self.text = "", []
        yield from self.closed(kind, text)

    async def stream(
        self,
        steps: AsyncIterator[AnswerStep],
        started: Callable[[], Iterable[T]],
        ended: Callable[[AnswerStep], Iterable[T]],
        failed: Callable[[EngineError], Iterable[T]],
    ) -> AsyncIterator[T]:
        """An answer's stream of events: `started` once the engine answered first (so a request
        that fails before it still gets an error status), the parts' events as the steps come,
        then `ended` with the last step; an engine failure after the start (the status was sent)
        ends the stream with `failed`."""
        async with aclosing(steps) as each:
            step = await anext(each, None)
            for event in started():
                yield event
            last = AnswerStep([], 0)
            try:
                while step is not None:
                    for event in self.feed(step.events):
                        yield event
                    last, step = step, await anext(each, None)
            except EngineError as error:
                for event in failed(error):
                    yield event
                return
            for event in ended(last):
                yield event

    def opened(self, kind: str, name: str | None) -> Iterator[T]:
        """A part begins (`name`: a call's function)."""
        raise NotImplementedError

    def grew(self, kind: str, text: str) -> Iterator[T]:
        """The open part got more text."""
        raise NotImplementedError

    def closed(self, kind: str, text: str) -> Iterator[T]:
        """The part ended with this whole text."""
        raise NotImplementedError


@dataclass
class Answer:
    """A whole answer: the message's reasoning, content and tool calls."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]


def read_answer(plan: ChatPlan, text: str) -> Answer:
    events = plan.reader().feed(text, final=True)
    thinking = [event.text for event in events if isinstance(event, ReasoningDelta)]
    assembled = assemble([event for event in events if not isinstance(event, ReasoningDelta)])
    reasoning = "".join(thinking) if thinking else None
    return Answer(reasoning, assembled.content, assembled.tool_calls)


@dataclass(slots=True)
class AnswerStep:
    """What one step of a generation added to the answer of its first sequence."""

    events: list[AnswerEvent]
    completion_tokens: int  # so far
    finish_reason: FinishReason | None = None  # set on the last step
    stop: str | None = None  # the stop string it ended at (last step)
    cached_tokens: int = 0  # prompt tokens found in the engine's KV cache (last step)


async def answer_steps(
    generator: Generator,
    prepared: PreparedRequest,
    plan: ChatPlan,
    cancelled: asyncio.Event | None = None,
) -> AsyncIterator[AnswerStep]:
    """The answer of a one-sequence request, read as it is generated (the APIs that answer
    with one message: Responses, Messages). Setting `cancelled` stops the generation at its next
    step; the last step then finishes with CANCELLED."""
    reader = plan.reader()
    tokens = 0
    async with aclosing(generator.stream(prepared)) as chunks:
        async for chunk in chunks:
            tokens += chunk.token_count
            final = chunk.finish_reason is not None
            events = reader.feed(chunk.text, final)
            if not final and cancelled is not None and cancelled.is_set():
                yield AnswerStep(events + reader.feed("", True), tokens, FinishReason.CANCELLED)
                return
            if events or final:
                yield AnswerStep(
                    events, tokens, chunk.finish_reason, chunk.stop, chunk.cached_tokens
                )
