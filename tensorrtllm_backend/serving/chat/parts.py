"""An answer's parts as its events arrive, for the APIs that answer with one message of parts
(the Responses API's output items, Anthropic's content blocks): its thinking, its text and each
tool call. A part opens, grows and closes; each API's builder renders these as its own events and
keeps its answer object (items, blocks) as they happen. A streamed answer sends those events; a
whole one is the same events, collected, fed at once (:meth:`AnswerParts.build`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import aclosing
from typing import Generic, TypeVar

from ...common.engine_api import EngineError
from .events import AnswerEvent, ArgumentsDelta, CallStart, ReasoningDelta
from .stream import AnswerStep
from .usage import TokenCount

T = TypeVar("T")


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

    def build(self, events: list[AnswerEvent]) -> None:
        """A whole answer's parts at once: the answer object is built, and the events a stream
        would have sent are not needed."""
        for _ in self.feed(events):
            pass
        for _ in self.close():
            pass

    async def stream(
        self,
        steps: AsyncIterator[AnswerStep],
        usage: TokenCount,
        started: Callable[[], Iterable[T]],
        ended: Callable[[AnswerStep], Iterable[T]],
        failed: Callable[[EngineError], Iterable[T]],
    ) -> AsyncIterator[T]:
        """An answer's stream of events (of its one sequence): `started` once the engine
        answered first (so a request that fails before it still gets an error status), the
        parts' events as the steps come (counted in `usage`), then `ended` with the last step;
        an engine failure after the start (the status was sent) ends the stream with `failed`."""
        async with aclosing(steps) as each:
            step = await anext(each, None)
            for event in started():
                yield event
            last = AnswerStep(0)
            try:
                while step is not None:
                    usage.add(step)
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
