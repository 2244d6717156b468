"""The one answer-event stream of a request, and the whole answer as those events collected.

Every API reads its answer here: chat completions (whole and streamed, every sequence), the
Responses API, Anthropic's Messages, completions. Each step is what one engine step added to one
sequence: the text that became final, that text read by the chat plan (thinking, content, tool
calls), the tokens behind it with their log probs, and on a sequence's last step its finish. A
renderer turns steps into its API's events; a whole answer is the same steps collected
(:func:`collect`) and rendered once, so the two cannot disagree.

This runs once per token: plain dataclasses with slots, and the text is read only when the plan
needs it (reasoning, tool calls) or the caller asked for content events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace

from ..generation import Generator, PreparedRequest
from ..ids import new_request_id
from ..schemas import FinishReason, TopLogProbs
from .answer import AnswerReader, ChatPlan
from .events import AnswerEvent, ContentDelta
from .usage import TokenCount


class AnswerStep:
    """What one step of a generation added to sequence `index`'s answer.

    A plain class with slots and literal defaults: one is made per token."""

    __slots__ = (
        "index", "text", "events", "token_ids", "log_probs", "top_log_probs", "token_count",
        "finish_reason", "stop", "cached_tokens",
    )  # fmt: skip

    def __init__(
        self,
        index: int,
        text: str = "",
        events: Sequence[AnswerEvent] = (),
        *,
        finish_reason: FinishReason | None = None,
        stop: str | None = None,
        cached_tokens: int = 0,
    ) -> None:
        self.index = index
        self.text = text  # the text that became final
        self.events = events  # the text, read
        self.token_ids: list[int] = []  # the tokens behind the text
        self.log_probs: list[float] = []  # theirs, when asked for
        self.top_log_probs: list[TopLogProbs] = []
        self.token_count = 0  # tokens generated in the step
        self.finish_reason = finish_reason  # on the sequence's last step
        self.stop = stop  # the stop string it ended at (last step)
        self.cached_tokens = cached_tokens  # prompt tokens found in the KV cache (last step)


def answer_steps(
    generator: Generator,
    prepared: PreparedRequest,
    plan: ChatPlan | None = None,
    cancelled: asyncio.Event | None = None,
) -> AsyncIterator[AnswerStep]:
    """The steps of every sequence of a request, interleaved as the engine answers. `plan`: how
    a chat answer is read (None: the text is not read into events, as completions need).

    A step is sent when it has text or ends its sequence: tokens whose text is still held back (a
    partial character, a possible stop string) travel with the next text of their sequence.
    Setting `cancelled` stops the generation at its next step; every sequence then ends with
    CANCELLED. A plan with a thinking budget answers in two requests when the thinking reaches
    it (:func:`_budgeted_steps`).
    """
    if plan is not None and plan.thinking_budget is not None:
        if prepared.params.num_return_sequences == 1:
            return _budgeted_steps(generator, prepared, plan, plan.thinking_budget, cancelled)
    return _steps(generator, prepared, plan, cancelled)


async def _steps(
    generator: Generator,
    prepared: PreparedRequest,
    plan: ChatPlan | None,
    cancelled: asyncio.Event | None,
    readers: list[AnswerReader] | None = None,
    finish_readers: bool = True,
) -> AsyncIterator[AnswerStep]:
    """:func:`answer_steps` of one request (`readers`: the sequences' own, when they go on
    reading after it; `finish_readers`: its end is the answer's)."""
    count = prepared.params.num_return_sequences
    if readers is None and plan is not None and plan.reads_text:
        readers = [plan.reader() for _ in range(count)]
    content = plan is not None  # read into events; without a reader, the text is all content

    def read(index: int, text: str, final: bool) -> Sequence[AnswerEvent]:
        if readers is not None:
            return readers[index].feed(text, final and finish_readers)
        return (ContentDelta(text),) if text else ()

    pending = [AnswerStep(index) for index in range(count)]
    open_sequences = set(range(count))
    async with aclosing(generator.stream(prepared)) as chunks:
        async for chunk in chunks:
            index = chunk.index
            step = pending[index]
            step.token_ids += chunk.token_ids
            if chunk.log_probs:
                step.log_probs += chunk.log_probs
            if chunk.top_log_probs:
                step.top_log_probs += chunk.top_log_probs
            step.token_count += chunk.token_count
            final = chunk.finish_reason is not None
            if not final and cancelled is not None and cancelled.is_set():
                step.text = chunk.text
                for index in sorted(open_sequences):
                    step = pending[index]
                    if content:
                        step.events = read(index, step.text, True)
                    step.finish_reason = FinishReason.CANCELLED
                    yield step
                return
            text = chunk.text
            if text or final:
                step.text = text
                if content:
                    step.events = read(index, text, final)
                if final:
                    step.finish_reason, step.stop = chunk.finish_reason, chunk.stop
                    step.cached_tokens = chunk.cached_tokens
                    open_sequences.discard(index)
                yield step
                pending[index] = AnswerStep(index)


async def _budgeted_steps(
    generator: Generator,
    prepared: PreparedRequest,
    plan: ChatPlan,
    budget: int,
    cancelled: asyncio.Event | None,
) -> AsyncIterator[AnswerStep]:
    """One sequence whose thinking may take `budget` tokens: the engine generates that many; if
    the thinking has not ended by then, its end marker is written for it, and a second request,
    the prompt and all so far, generates the rest of max_tokens. A request the thinking ends
    within, or the answer itself, runs once, as any other."""
    assert plan.reasoning is not None
    reader = plan.reader()
    params = prepared.params
    texts: list[str] = []
    token_ids: list[int] = []
    used = 0
    if budget > 0:
        first = replace(prepared, params=params.model_copy(update={"max_tokens": budget}))
        async with aclosing(_steps(generator, first, plan, cancelled, [reader], False)) as steps:
            async for step in steps:
                texts.append(step.text)
                token_ids += step.token_ids
                used += step.token_count
                ended = step.finish_reason
                if ended is not None and (
                    ended is not FinishReason.LENGTH or used >= params.max_tokens
                ):
                    step.events = [*step.events, *reader.feed("", True)]
                    yield step
                    return
                if ended is not None:  # the budget, not the answer, ended: it goes on
                    step.finish_reason, step.stop, step.cached_tokens = None, None, 0
                yield step
    marker = plan.reasoning.fmt.end if reader.reasoning else ""
    if marker:
        yield AnswerStep(0, "", reader.feed(marker))  # the thinking ends here
    tokenizer = generator.tokenizer
    continued = [*token_ids, *tokenizer.encode(marker, add_special_tokens=False)]
    rest = PreparedRequest(
        new_request_id(),
        prepared.prompt + "".join(texts) + marker,
        params.model_copy(update={"max_tokens": params.max_tokens - used}),
        [*prepared.prompt_ids, *continued],
        prepared.api,
        prepared.lora,
        prepared.images,  # the continuation's prompt holds them too
        None if prepared.written_ids is None else [*prepared.written_ids, *continued],
    )
    async with aclosing(_steps(generator, rest, plan, cancelled, [reader])) as steps:
        async for step in steps:
            if step.finish_reason is not None:  # the prompt's own cache hits only
                step.cached_tokens = min(step.cached_tokens, len(prepared.prompt_ids))
            yield step


@dataclass(slots=True)
class SequenceAnswer:
    """One sequence's steps, collected."""

    index: int
    pieces: list[str] = field(default_factory=list)
    events: list[AnswerEvent] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    top_log_probs: list[TopLogProbs] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop: str | None = None
    token_count: int = 0  # tokens generated

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def cum_log_prob(self) -> float:
        return sum(self.log_probs)

    def add(self, step: AnswerStep) -> None:
        self.pieces.append(step.text)
        self.events += step.events
        self.token_ids += step.token_ids
        self.log_probs += step.log_probs
        self.top_log_probs += step.top_log_probs
        self.token_count += step.token_count
        if step.finish_reason is not None:
            self.finish_reason, self.stop = step.finish_reason, step.stop


@dataclass(slots=True)
class WholeAnswer:
    """Every sequence of a request (in index order) and its usage."""

    sequences: list[SequenceAnswer]
    usage: TokenCount

    @property
    def render_size(self) -> int:
        """About the characters rendering the answer handles (its text, and a few per token
        named in log probs and their alternatives): what decides whether rendering runs off
        the event loop."""
        return sum(
            sum(len(piece) for piece in sequence.pieces)
            + 8 * len(sequence.log_probs)
            + 8 * sum(len(ids) for ids, _ in sequence.top_log_probs)
            for sequence in self.sequences
        )


async def collect(prepared: PreparedRequest, steps: AsyncIterator[AnswerStep]) -> WholeAnswer:
    """The whole answer: `steps` (of :func:`answer_steps`) gathered per sequence."""
    sequences = [SequenceAnswer(i) for i in range(prepared.params.num_return_sequences)]
    usage = TokenCount(len(prepared.prompt_ids))
    async with aclosing(steps) as each:
        async for step in each:
            usage.add(step)
            sequences[step.index].add(step)
    return WholeAnswer(sequences, usage)
