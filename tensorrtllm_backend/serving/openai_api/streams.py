"""OpenAI's renderer: the answer steps of the chat core as chat completion and completion
objects, streamed (SSE chunks, tool-call deltas included) or whole, with OpenAI's usage and
finish reasons.

Chunks are assembled from pre-rendered text: this runs once per token, where building and
dumping pydantic models would dominate the serving cost.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from ..chat.answer import ChatPlan
from ..chat.events import CallStart
from ..chat.request import UsageReport
from ..chat.stream import AnswerStep, answer_steps
from ..chat.usage import TokenCount
from ..generation import Generator, PreparedRequest
from ..schemas import FinishReason, PromptTokensDetails, TopLogProbs, Usage
from ..web.sse import SSE_DONE
from .chat_deltas import delta_json

_json = json.dumps
# OpenAI's finish reasons of the core's; any other ending is "stop".
FINISH_REASONS = {FinishReason.LENGTH: "length"}


def finish_reason(reason: FinishReason | None, calls: bool = False) -> str | None:
    """OpenAI's finish reason; a sequence that ended on its own after calling tools finishes
    with "tool_calls"."""
    if reason is None:
        return None
    if calls and reason is FinishReason.STOP:
        return "tool_calls"
    return FINISH_REASONS.get(reason, "stop")


def openai_usage(count: TokenCount) -> Usage:
    return Usage(
        prompt_tokens=count.prompt_tokens,
        completion_tokens=count.completion_tokens,
        total_tokens=count.total_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=count.cached_tokens),
    )


class LogProbs:
    """OpenAI's log-prob objects of the tokens of one answer (or one streamed step of it).

    `tokens`: the tokens' text, `top`: their alternatives when asked for (`strings` gives the
    text of ids: every id of one step decoded in one call)."""

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


_Render = Callable[["ChunkEvents", AnswerStep, Any], list[str]]
"""Turns one step of a streamed answer, with its log probs (or None), into SSE chunk events."""
_ROLE_DELTA = '"delta":{"role":"assistant","content":""},"finish_reason":null'


class StreamRenderer:
    """The streamed chat answers of :class:`~.serving.OpenAIServing`."""

    generator: Generator
    model_name: str

    def log_probs(
        self, token_ids: list[int], log_probs: list[float], top: list[TopLogProbs] | None
    ) -> LogProbs:
        return LogProbs(token_ids, log_probs, top, self.generator.token_strings)

    async def _stream(
        self,
        prepared: PreparedRequest,
        usage_report: UsageReport,
        plan: ChatPlan | None,
        render: _Render,
    ) -> AsyncIterator[str]:
        """The SSE events of one streamed chat answer: `render` turns each step (with its log
        probs, when asked for) into chunk events; usage (in every chunk too, when continuous)
        and [DONE] follow."""
        out = ChunkEvents(
            "chat.completion.chunk", f"chatcmpl-{prepared.request_id}", self.model_name
        )
        params = prepared.params
        want, top = params.return_log_probs, bool(params.top_log_probs)
        usage = TokenCount(len(prepared.prompt_ids))
        async with aclosing(answer_steps(self.generator, prepared, plan)) as steps:
            async for step in steps:
                usage.add(step)
                logprobs = None
                if want and step.token_ids:
                    found = self.log_probs(
                        step.token_ids, step.log_probs, step.top_log_probs if top else None
                    )
                    logprobs = found.chat()
                for chunk in render(out, step, logprobs):
                    if usage_report.continuous:
                        chunk = out.with_usage(chunk, openai_usage(usage))
                    yield chunk
        if usage_report.final:
            yield out.usage(openai_usage(usage))
        yield SSE_DONE

    def stream_chat(
        self, prepared: PreparedRequest, usage: UsageReport, plan: ChatPlan | None = None
    ) -> AsyncIterator[str]:
        if plan is not None and plan.reads_text:
            return self._stream(prepared, usage, plan, _ReadChunks())
        role_sent: set[int] = set()

        def render(out: ChunkEvents, step: AnswerStep, logprobs: Any) -> list[str]:
            chunks = []
            if step.index not in role_sent:  # once Triton answered: failures get a status
                chunks.append(out.choice(step.index, _ROLE_DELTA))
                role_sent.add(step.index)
            finish = finish_reason(step.finish_reason)
            chunks.append(
                out.choice(
                    step.index,
                    f'"delta":{{"content":{_json(step.text)}}},'
                    f'"finish_reason":{_json(finish)},"logprobs":{_json(logprobs)}',
                )
            )
            return chunks

        return self._stream(prepared, usage, None, render)


class _ReadChunks:
    """Chat chunks of answers that were read (reasoning, tool calls): each step's events are
    sent as deltas."""

    def __init__(self) -> None:
        self._calls: dict[int, int] = {}  # calls started so far, per sequence

    def __call__(self, out: ChunkEvents, step: AnswerStep, logprobs: Any) -> list[str]:
        chunks = []
        calls = self._calls.get(step.index)
        if calls is None:
            calls = self._calls[step.index] = 0
            chunks.append(out.choice(step.index, _ROLE_DELTA))
        deltas = [delta_json(event) for event in step.events]
        calls += sum(isinstance(event, CallStart) for event in step.events)
        self._calls[step.index] = calls
        if logprobs is not None and not deltas:
            deltas = ['{"content":""}']
        for delta in deltas:
            chunks.append(
                out.choice(
                    step.index,
                    f'"delta":{delta},"finish_reason":null,"logprobs":{_json(logprobs)}',
                )
            )
            logprobs = None
        if step.finish_reason is not None:
            finish = finish_reason(step.finish_reason, calls > 0)
            chunks.append(out.choice(step.index, f'"delta":{{}},"finish_reason":{_json(finish)}'))
        return chunks


class ChunkEvents:
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
