"""Streamed OpenAI answers: SSE chunks of completions and chat completions (tool-call deltas
included), and the helpers that streamed and whole answers share.

Chunks are assembled from pre-rendered text: this runs once per token, where building and
dumping pydantic models would dominate the serving cost.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ..generation import Generator, PreparedRequest
from ..schemas import FinishReason, PromptTokensDetails, SequenceResult, TopLogProbs
from .answers import ChatPlan
from .protocol import Usage, UsageReport
from .tool_stream import ChatDeltas

_json = json.dumps


def sse(payload: BaseModel | dict[str, Any] | str) -> str:
    if isinstance(payload, BaseModel):
        payload = payload.model_dump_json(exclude_none=True)
    elif isinstance(payload, dict):
        payload = json.dumps(payload)
    return f"data: {payload}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def finish_reason(reason: FinishReason | None) -> str | None:
    return None if reason is None else ("length" if reason is FinishReason.LENGTH else "stop")


def call_finish_reason(reason: str | None, calls: bool) -> str | None:
    """A sequence that ended on its own after calling tools finishes with "tool_calls"."""
    return "tool_calls" if calls and reason == "stop" else reason


@dataclass(slots=True)
class _Event:
    index: int
    text: str
    finish_reason: str | None
    token_ids: list[int]
    log_probs: list[float]
    top: list[TopLogProbs]
    token_count: int
    cached_tokens: int = 0  # of the prompt, on a sequence's last event

    @classmethod
    def empty(cls, index: int) -> _Event:
        """Nothing gathered yet for sequence `index`."""
        return cls(index, "", None, [], [], [], 0)


_Render = Callable[["_ChunkEvents", _Event, Any], list[str]]
"""Turns one event of a streamed answer, with its log probs (or None), into SSE chunk events."""


class LogProbs:
    """OpenAI's log-prob objects of the tokens of one answer (or one streamed event of it).

    `tokens`: the tokens' text, `top`: their alternatives when asked for (`strings` gives the
    text of ids: every id of one event decoded in one call)."""

    def __init__(
        self,
        token_ids: list[int],
        log_probs: list[float],
        top: list[TopLogProbs] | None,
        strings: Callable[[list[int]], list[str]],
    ) -> None:
        alternatives = [i for ids, _ in top or () for i in ids]
        texts = strings(token_ids + alternatives)
        self.tokens = texts[: len(token_ids)]
        self.log_probs = log_probs
        self.top: list[list[tuple[str, float]]] | None = None
        if top is not None:
            rest = iter(texts[len(token_ids) :])
            self.top = [[(next(rest), lp) for lp in values] for _, values in top]

    def completion(self, offset: int) -> dict[str, Any]:
        """The legacy completions shape; `offset`: where the first token's text starts in the
        choice's text."""
        offsets = []
        for token in self.tokens:
            offsets.append(offset)
            offset += len(token)
        top = None if self.top is None else [dict(entry) for entry in self.top]
        return {
            "text_offset": offsets,
            "tokens": self.tokens,
            "token_logprobs": self.log_probs,
            "top_logprobs": top,
        }

    def chat(self) -> dict[str, Any]:
        tops = self.top or [[] for _ in self.tokens]
        return {
            "content": [
                {
                    **_chat_token(token, log_prob),
                    "top_logprobs": [_chat_token(t, lp) for t, lp in alternatives],
                }
                for token, log_prob, alternatives in zip(
                    self.tokens, self.log_probs, tops, strict=False
                )
            ]
        }


def _chat_token(token: str, log_prob: float) -> dict[str, Any]:
    return {"token": token, "logprob": log_prob, "bytes": list(token.encode())}


class StreamingServing:
    """The streaming half of :class:`~.serving.OpenAIServing`."""

    generator: Generator
    model_name: str

    def _usage(self, prepared: PreparedRequest, completion_tokens: int, cached: int = 0) -> Usage:
        """Usage; `cached`: prompt tokens the engine found in its KV cache (0: it cannot tell)."""
        prompt = len(prepared.prompt_ids)
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=completion_tokens,
            total_tokens=prompt + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )

    def _log_probs(
        self, token_ids: list[int], log_probs: list[float], top: list[TopLogProbs] | None
    ) -> LogProbs:
        return LogProbs(token_ids, log_probs, top, self.generator.token_strings)

    def _sequence_log_probs(self, sequence: SequenceResult) -> LogProbs:
        """The log probs of a gathered sequence."""
        return self._log_probs(
            sequence.log_prob_token_ids or [], sequence.log_probs or [], sequence.top_log_probs
        )

    async def _events(self, prepared: PreparedRequest) -> AsyncIterator[_Event]:
        """Chunks with text (or the finish reason), carrying the tokens behind that text.

        Tokens whose text is still held back (a partial character) travel with the next text
        of their sequence.
        """
        pending = [_Event.empty(i) for i in range(prepared.params.num_return_sequences)]
        async with aclosing(self.generator.stream(prepared)) as chunks:
            async for chunk in chunks:
                event = pending[chunk.index]
                event.token_ids += chunk.token_ids
                event.log_probs += chunk.log_probs or []
                event.top += chunk.top_log_probs or []
                event.token_count += chunk.token_count
                if chunk.text or chunk.finish_reason is not None:
                    event.text, event.finish_reason = chunk.text, finish_reason(chunk.finish_reason)
                    event.cached_tokens = chunk.cached_tokens
                    yield event
                    pending[chunk.index] = _Event.empty(chunk.index)

    async def _stream(
        self, prepared: PreparedRequest, usage: UsageReport, chat: bool, render: _Render
    ) -> AsyncIterator[str]:
        """The SSE events of one streamed answer, chat or completion: `render` turns each event
        (with its log probs, when asked for) into chunk events; usage (in every chunk too, when
        continuous) and [DONE] follow."""
        if chat:
            out = _ChunkEvents(
                "chat.completion.chunk", f"chatcmpl-{prepared.request_id}", self.model_name
            )
        else:
            out = _ChunkEvents("text_completion", f"cmpl-{prepared.request_id}", self.model_name)
        params = prepared.params
        want, top = params.return_log_probs, bool(params.top_log_probs)
        # Completions: where each choice's next token starts in its text (text_offset).
        offsets = [0 if params.exclude_input_in_output else len(prepared.prompt)] * (
            params.num_return_sequences
        )
        completion_tokens = cached = 0
        async with aclosing(self._events(prepared)) as events:
            async for event in events:
                completion_tokens += event.token_count
                cached = max(cached, event.cached_tokens)
                logprobs = None
                if want and event.token_ids:
                    found = self._log_probs(
                        event.token_ids, event.log_probs, event.top if top else None
                    )
                    if chat:
                        logprobs = found.chat()
                    else:
                        logprobs = found.completion(offsets[event.index])
                        offsets[event.index] += sum(len(token) for token in found.tokens)
                for chunk in render(out, event, logprobs):
                    if usage.continuous:
                        so_far = self._usage(prepared, completion_tokens, cached)
                        chunk = out.with_usage(chunk, so_far)
                    yield chunk
        if usage.final:
            yield out.usage(self._usage(prepared, completion_tokens, cached))
        yield SSE_DONE

    def stream_completion(
        self, prepared: PreparedRequest, usage: UsageReport
    ) -> AsyncIterator[str]:
        def render(out: _ChunkEvents, event: _Event, logprobs: Any) -> list[str]:
            return [
                out.choice(
                    event.index,
                    f'"text":{_json(event.text)},"finish_reason":{_json(event.finish_reason)},'
                    f'"logprobs":{_json(logprobs)}',
                )
            ]

        return self._stream(prepared, usage, False, render)

    def stream_chat(
        self, prepared: PreparedRequest, usage: UsageReport, plan: ChatPlan | None = None
    ) -> AsyncIterator[str]:
        if plan is not None and plan.reads_text:
            return self._stream(prepared, usage, True, _AnswerChunks(plan))
        role_sent: set[int] = set()

        def render(out: _ChunkEvents, event: _Event, logprobs: Any) -> list[str]:
            chunks = []
            if event.index not in role_sent:  # once Triton answered: failures get a status
                chunks.append(out.choice(event.index, _ROLE_DELTA))
                role_sent.add(event.index)
            chunks.append(
                out.choice(
                    event.index,
                    f'"delta":{{"content":{_json(event.text)}}},'
                    f'"finish_reason":{_json(event.finish_reason)},"logprobs":{_json(logprobs)}',
                )
            )
            return chunks

        return self._stream(prepared, usage, True, render)


_ROLE_DELTA = '"delta":{"role":"assistant","content":""},"finish_reason":null'


class _AnswerChunks:
    """Chat chunks of answers that need reading (reasoning, tool calls): each sequence's text
    goes through its answer reader, whose deltas are sent as they become certain."""

    def __init__(self, plan: ChatPlan) -> None:
        self._plan = plan
        self._streams: dict[int, ChatDeltas] = {}

    def __call__(self, out: _ChunkEvents, event: _Event, logprobs: Any) -> list[str]:
        chunks = []
        stream = self._streams.get(event.index)
        if stream is None:
            stream = self._streams[event.index] = ChatDeltas(self._plan.reader())
            chunks.append(out.choice(event.index, _ROLE_DELTA))
        final = event.finish_reason is not None
        deltas = stream.deltas(event.text, final)
        if logprobs is not None and not deltas:
            deltas = ['{"content":""}']
        for delta in deltas:
            chunks.append(
                out.choice(
                    event.index,
                    f'"delta":{delta},"finish_reason":null,"logprobs":{_json(logprobs)}',
                )
            )
            logprobs = None
        if final:
            finish = call_finish_reason(event.finish_reason, stream.calls > 0)
            chunks.append(out.choice(event.index, f'"delta":{{}},"finish_reason":{_json(finish)}'))
        return chunks


class _ChunkEvents:
    """SSE chunk events assembled from a pre-rendered head: this runs once per token, where
    building and dumping pydantic models would dominate the serving cost."""

    def __init__(self, object_type: str, request_id: str, model: str) -> None:
        created = int(time.time())
        self._head = (
            f'data: {{"id":{_json(request_id)},"object":{_json(object_type)},'
            f'"created":{created},"model":{_json(model)},"choices":['
        )

    def choice(self, index: int, body: str) -> str:
        return f'{self._head}{{"index":{index},{body}}}]}}\n\n'

    def usage(self, usage: Usage) -> str:
        return f'{self._head}],"usage":{usage.model_dump_json()}}}\n\n'

    @staticmethod
    def with_usage(chunk: str, usage: Usage) -> str:
        """A chunk event of :meth:`choice` with the usage so far added."""
        return f'{chunk[:-3]},"usage":{usage.model_dump_json()}}}\n\n'
