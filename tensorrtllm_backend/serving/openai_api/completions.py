"""OpenAI's `/v1/completions` over the core: a batch of prompts, echo, and the prompt's log probs.

A request's `prompt` is a string, a list of strings, a list of token ids or a list of such lists;
each prompt is one core request (a :class:`Job`), and its choices come in OpenAI's order:
prompt-major, then the n sequences of each prompt (choice index = prompt x n + sequence). Usage
sums every prompt's.

`echo` puts each prompt's text before its choices' text (token-id prompts: their decoded text).
With `logprobs`, the echoed prompt carries its tokens' log probs too, as OpenAI answers and
evaluation harnesses read them (`echo: true, logprobs: k, max_tokens: 0 or 1`): the first token's
is null, the others are the engine's, computed from its context logits by one scoring request
per prompt (:meth:`~..generation.Generator.score`); each position's alternatives hold the k most
likely tokens and the prompt's own. `max_tokens: 0` with echo scores without generating. vLLM's
`prompt_logprobs` returns the same scores in vLLM's shape (per choice).

Where the generation returns no alternatives of its own (TensorRT-LLM's C++ backend, the ensemble
and BLS routes), a request with echo and `max_tokens: 1` gets its generated token's from the same
scoring request: the last row of the context logits is that token's distribution.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Coroutine
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from ...common.tokenization import IncrementalDetokenizer
from ..apis import COMPLETIONS_LABEL
from ..chat.core import ChatCore
from ..chat.output_format import output_constraint
from ..chat.request import UsageReport
from ..chat.stream import AnswerStep, SequenceAnswer, WholeAnswer, answer_steps, collect
from ..chat.usage import TokenCount
from ..generation import PreparedRequest
from ..request_errors import RequestError
from ..schemas import MAX_RETURN_SEQUENCES, FinishReason, SamplingParams, TopLogProbs
from ..translation import PromptLogProbs
from ..web.sse import SSE_DONE
from .merge import merged
from .prompt_logprobs import vllm_prompt_logprobs
from .protocol import CompletionChoice, CompletionRequest, CompletionResponse
from .streams import ChunkEvents, LogProbs, finish_reason, openai_usage

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Prompt tokens x (alternatives + 1) of one request's scores: each becomes a few dozen bytes of
# JSON, so the bound keeps an answer within some tens of megabytes.
MAX_PROMPT_LOG_PROB_ENTRIES = 1 << 20
# Choices of one request (prompts x candidates): each is an engine sequence.
MAX_COMPLETION_CHOICES = 1024


@dataclass(slots=True)
class Job:
    """One prompt of a request: its core request, whether it generates (max_tokens 0 with echo
    only scores), and the alternatives its scores list (None: the prompt is not scored)."""

    prepared: PreparedRequest
    generate: bool = True
    score: int | None = None
    scores: PromptLogProbs | None = None
    # Where the generation returns no alternatives: how many of the first generated token's come
    # from the scores (0: none asked for there), and the scorer's answer.
    first_token: int = 0
    first_top: TopLogProbs | None = None

    @property
    def score_entries(self) -> int:
        """The prompt's scores in entries (tokens x (alternatives + 1)): what their rendering
        costs."""
        return len(self.prepared.prompt_ids) * ((self.score or 0) + 1)


@dataclass(slots=True)
class _Plan:
    """What a request's answer shows, beside the generated text."""

    echo: bool
    logprobs: int | None  # legacy log probs (prompt ones too, with echo)
    prompt_logprobs: int | None  # vLLM's
    n: int
    jobs: list[Job] = field(default_factory=list)


class CompletionServing:
    """`/v1/completions` of the served model."""

    def __init__(self, core: ChatCore, add_special_tokens: bool = True) -> None:
        """`add_special_tokens`: whether text prompts get the tokenizer's special tokens when
        the request does not say (TRTLLM_COMPLETIONS_ADD_SPECIAL_TOKENS)."""
        self.core = core
        self.generator = core.generator
        self.model_name = core.model_name
        self.add_special_tokens = add_special_tokens

    # -- preparing ---------------------------------------------------------------------------
    async def prepare(self, request: CompletionRequest, size: int = 0) -> _Plan:
        """Every prompt's core request (`size`: the request body's bytes)."""
        if request.suffix:
            raise RequestError("suffix is not supported", param="suffix")
        candidates = request.candidates
        _check_best_of(request, candidates)
        prompts = request.prompts
        if len(prompts) * candidates > MAX_COMPLETION_CHOICES:
            raise RequestError(
                f"{len(prompts)} prompts x {candidates} sequences is more than the "
                f"{MAX_COMPLETION_CHOICES} choices one request may ask for: send fewer prompts "
                "per request",
                param="prompt",
            )
        generate = request.max_tokens != 0
        if not generate and not (request.echo or request.prompt_logprobs is not None):
            raise RequestError(
                "max_tokens 0 generates nothing: set echo (with logprobs to score the prompt)",
                param="max_tokens",
            )
        if request.prompt_logprobs is not None and request.stream:
            raise RequestError(
                "prompt_logprobs are not streamed: send stream false (or echo with logprobs)",
                param="prompt_logprobs",
            )
        score = _score_alternatives(request)
        plan = _Plan(request.echo, request.logprobs, request.prompt_logprobs, request.n)
        if not generate:
            request = request.model_copy(update={"max_tokens": 1})
        constraint = output_constraint(request)
        # best_of ranks the sequences by their log probs: the engine returns them.
        params = self.core.sampling(
            request,
            request.logprobs is not None or candidates > request.n,
            constraint.guide if constraint else None,
            top_log_probs=request.logprobs or 0,
            default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
        )
        if candidates > request.n:
            params = params.model_copy(update={"num_return_sequences": candidates})
        first_token = self._first_token_from_scores(request, params, generate)
        if first_token or not generate:  # nothing generated asks the engine for alternatives
            params = params.model_copy(update={"top_log_probs": 0})
        param = constraint.param if constraint else None
        share = max(1, size // len(prompts))
        special = request.add_special_tokens
        special = self.add_special_tokens if special is None else special
        for position, prompt in enumerate(prompts):
            text, ids = (prompt, None) if isinstance(prompt, str) else ("", prompt)
            try:
                prepared = await self.core.admit(
                    request, text, params, param, COMPLETIONS_LABEL, share,
                    top_param="logprobs", token_ids=ids, add_special_tokens=special,
                )  # fmt: skip
                if score is not None:
                    self.generator.check_scoring(prepared, score, bool(first_token))
            except RequestError as error:
                if error.param == "top_log_probs":  # the core's name of this API's logprobs
                    error.param = "logprobs"
                if len(prompts) > 1:  # which prompt of the batch
                    raise RequestError(
                        f"prompt {position}: {error}", error.status, error.param, error.kind,
                        error.code,
                    ) from None  # fmt: skip
                raise
            plan.jobs.append(Job(prepared, generate, score, first_token=first_token))
        entries = sum(job.score_entries for job in plan.jobs)
        if score is not None and entries > MAX_PROMPT_LOG_PROB_ENTRIES:
            raise RequestError(
                f"the prompt log probs asked for are {entries} entries (prompt tokens x "
                f"(alternatives + 1)), more than {MAX_PROMPT_LOG_PROB_ENTRIES} per request: send "
                "fewer or shorter prompts per request, or fewer alternatives",
                param="logprobs",
            )
        return plan

    def _first_token_from_scores(
        self, request: CompletionRequest, params: SamplingParams, generate: bool
    ) -> int:
        """How many of the generated token's alternatives come from the prompt's scores (0:
        none, or the generation's own): asked for where the generation returns none, with echo
        and one token to generate (the scores' last row is its distribution). Asked for
        elsewhere, they are a 400 saying what works."""
        missing = self.generator.top_log_probs_missing
        if not (generate and request.logprobs and missing):
            return 0
        if request.echo and params.max_tokens == 1:
            return request.logprobs
        raise RequestError(
            f"{missing}; with echo and max_tokens 1 (or 0), the generated token's alternatives "
            "come from the prompt's scores",
            param="logprobs",
        )

    # -- whole answers -----------------------------------------------------------------------
    async def complete(self, plan: _Plan, request: CompletionRequest) -> bytes:
        """Every prompt's whole answer, as its JSON body (a scored batch's is megabytes: built
        and encoded off the event loop); best_of keeps each prompt's n sequences of highest
        cumulative log probability (usage counts every one generated)."""
        answers = await _all([self._whole(job) for job in plan.jobs])
        size = sum(answer.render_size for answer in answers)
        size += sum(job.score_entries for job in plan.jobs)
        return await self.generator.offloader.run(size, self._body, plan, answers, request.n)

    def _body(self, plan: _Plan, answers: list[WholeAnswer], n: int) -> bytes:
        body = self._response(plan, answers, n).to_json()
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

    async def _whole(self, job: Job) -> WholeAnswer:
        if job.score is not None:
            await self._score(job)
        if job.generate:
            answer = await collect(job.prepared, answer_steps(self.generator, job.prepared))
            for sequence in answer.sequences:
                _add_first_top(job, sequence)
            return answer
        return _nothing_generated(job.prepared)

    async def _score(self, job: Job) -> None:
        """The job's prompt scores (and its first generated token's alternatives, where they
        come from them)."""
        assert job.score is not None
        if job.first_token:
            job.scores, (ids, values) = await self.generator.score_with_next(
                job.prepared, job.score
            )
            job.first_top = ids[: job.first_token], values[: job.first_token]
        else:
            job.scores = await self.generator.score(job.prepared, job.score)

    def _response(self, plan: _Plan, answers: list[WholeAnswer], n: int) -> CompletionResponse:
        usage = TokenCount(0)
        choices = []
        for position, (job, answer) in enumerate(zip(plan.jobs, answers, strict=True)):
            usage.prompt_tokens += answer.usage.prompt_tokens
            usage.add(_Total(answer.usage))
            prompt = _PromptPart(self, plan, job)
            for rank, sequence in enumerate(best_sequences(answer.sequences, n)):
                text = sequence.text
                logprobs = None
                if plan.logprobs is not None:
                    generated = self._log_probs(sequence, plan.logprobs)
                    logprobs = prompt.join(generated.completion(prompt.length))
                choices.append(
                    CompletionChoice(
                        index=position * n + rank,
                        text=prompt.text + text,
                        finish_reason=finish_reason(sequence.finish_reason),
                        logprobs=logprobs,
                        prompt_logprobs=prompt.vllm,
                    )
                )
        return CompletionResponse(
            id=f"cmpl-{plan.jobs[0].prepared.request_id}",
            model=self.model_name,
            choices=choices,
            usage=openai_usage(usage),
        )

    def _log_probs(self, sequence: SequenceAnswer | AnswerStep, k: int) -> LogProbs:
        top = sequence.top_log_probs if k else None
        return LogProbs(sequence.token_ids, sequence.log_probs, top, self.generator.token_strings)

    # -- streamed answers --------------------------------------------------------------------
    async def stream(self, plan: _Plan, report: UsageReport) -> AsyncIterator[str]:
        """The SSE events of every prompt's sequences, interleaved as they come: each choice
        starts with its echoed prompt (and its scores), then its steps; usage and [DONE]
        follow."""
        out = ChunkEvents("text_completion", f"cmpl-{plan.jobs[0].prepared.request_id}",
                          self.model_name)  # fmt: skip
        n = plan.n
        usage = TokenCount(sum(len(job.prepared.prompt_ids) for job in plan.jobs))
        # Where each choice's next token starts in its text (text_offset).
        offsets: dict[int, int] = {}

        def render(position: int, item: AnswerStep | _PromptPart) -> list[str]:
            if isinstance(item, _PromptPart):
                chunks = []
                for sequence in range(n):
                    index = position * n + sequence
                    offsets[index] = item.length
                    chunks.append(out.choice(index, _text_body(item.text, None, item.legacy)))
                return chunks
            usage.add(item)
            index = position * n + item.index
            logprobs = None
            if plan.logprobs is not None and item.token_ids:
                found = self._log_probs(item, plan.logprobs)
                offset = offsets.get(index, 0)
                logprobs = found.completion(offset)
                offsets[index] = offset + sum(len(token) for token in found.tokens)
            chunk = out.choice(index, _text_body(item.text, item.finish_reason, logprobs))
            if report.continuous:
                chunk = out.with_usage(chunk, openai_usage(usage))
            return [chunk]

        if len(plan.jobs) == 1:  # no merging layer on the per-token path
            async with aclosing(self._items(plan, plan.jobs[0])) as items:  # type: ignore[type-var]
                async for item in items:
                    for chunk in render(0, item):
                        yield chunk
        else:
            sources = [self._items(plan, job) for job in plan.jobs]
            async with aclosing(merged(sources)) as tagged:
                async for position, item in tagged:
                    for chunk in render(position, item):
                        yield chunk
        if report.final:
            yield out.usage(openai_usage(usage))
        yield SSE_DONE

    def _items(self, plan: _Plan, job: Job) -> AsyncIterator[AnswerStep | _PromptPart]:
        """One prompt's items: its answer's steps as the core yields them, or, with an echo or
        scores, :meth:`_job_steps`."""
        if job.generate and job.score is None and not plan.echo:
            return answer_steps(self.generator, job.prepared)
        return self._job_steps(plan, job)

    async def _job_steps(self, plan: _Plan, job: Job) -> AsyncIterator[AnswerStep | _PromptPart]:
        """One prompt's items: its echoed prompt (once its scores are known), then its steps."""
        if job.score is not None:
            await self._score(job)
        if plan.echo:
            yield await self.generator.offloader.run(
                job.score_entries, _PromptPart, self, plan, job
            )
        if not job.generate:
            for sequence in range(job.prepared.params.num_return_sequences):
                yield AnswerStep(sequence, finish_reason=FinishReason.LENGTH)
            return
        async with aclosing(answer_steps(self.generator, job.prepared)) as steps:
            async for step in steps:
                _add_first_top(job, step)
                yield step


async def _all(jobs: list[Coroutine[Any, Any, WholeAnswer]]) -> list[WholeAnswer]:
    """Every job's answer; the first failure is raised as it is (the API maps it to its status:
    a TaskGroup would wrap it in an ExceptionGroup) once the other jobs are cancelled."""
    if len(jobs) == 1:
        return [await jobs[0]]
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _add_first_top(job: Job, sequence: SequenceAnswer | AnswerStep) -> None:
    """The first generated token's alternatives from the scores, on a sequence (or its step)
    of one generated token, where the generation returned none (a text route that re-encodes
    the token's text into more ids: the first gets them)."""
    ids = sequence.token_ids
    if job.first_top is not None and ids and not sequence.top_log_probs:
        sequence.top_log_probs = [job.first_top, *[([], [])] * (len(ids) - 1)]


def _score_alternatives(request: CompletionRequest) -> int | None:
    """The alternatives per position the prompt's scores need (None: no scores)."""
    wanted = [
        k
        for k in (request.logprobs if request.echo else None, request.prompt_logprobs)
        if k is not None
    ]
    return max(wanted) if wanted else None


class _Total:
    """A whole answer's completion count as one step (for TokenCount.add)."""

    __slots__ = ("token_count", "cached_tokens")

    def __init__(self, count: TokenCount) -> None:
        self.token_count = count.completion_tokens
        self.cached_tokens = count.cached_tokens


def _nothing_generated(prepared: PreparedRequest) -> WholeAnswer:
    """max_tokens 0: every sequence ends at once, for length."""
    sequences = [
        SequenceAnswer(i, finish_reason=FinishReason.LENGTH)
        for i in range(prepared.params.num_return_sequences)
    ]
    return WholeAnswer(sequences, TokenCount(len(prepared.prompt_ids)))


def _text_body(text: str, finish: FinishReason | None, logprobs: Any) -> str:
    return (
        f'"text":{json.dumps(text)},"finish_reason":{json.dumps(finish_reason(finish))},'
        f'"logprobs":{json.dumps(logprobs)}'
    )


class _PromptPart:
    """What a choice shows of its prompt: the echoed text, and with scores, its tokens' log
    probs in the legacy shape (`legacy`) and in vLLM's (`vllm`), made once (in proportion to
    the prompt: the callers make it off the event loop when large)."""

    def __init__(self, serving: CompletionServing, plan: _Plan, job: Job) -> None:
        prepared = job.prepared
        self.text = prepared.prompt if plan.echo else ""
        self._plan = plan
        self._scores = job.scores
        self._ids = prepared.prompt_ids
        self._strings = serving.generator.token_strings
        self._tokenizer = serving.generator.tokenizer
        self.length = len(self.text)  # where the generated text starts
        self.legacy = self._legacy()
        self.vllm = (
            None
            if plan.prompt_logprobs is None or job.scores is None
            else vllm_prompt_logprobs(job.scores, self._ids, plan.prompt_logprobs, self._strings)
        )

    def _legacy(self) -> dict[str, Any] | None:
        """The echoed prompt's entries of the legacy log probs (None without them)."""
        k = self._plan.logprobs
        if not self._plan.echo or k is None or self._scores is None:
            return None
        scores = self._scores
        tokens = self._strings(self._ids)
        top: list[dict[str, float] | None] = [None]
        alternatives = scores.top or [([], [])] * len(scores.log_probs)
        texts = iter(self._strings([i for ids, _ in alternatives for i in ids[:k]]))
        for token, value, (ids, values) in zip(
            tokens[1:], scores.log_probs, alternatives, strict=True
        ):
            entry = {next(texts): lp for _, lp in zip(ids[:k], values[:k], strict=True)}
            entry.setdefault(token, value)  # the prompt's own token, as OpenAI lists it
            top.append(entry)
        return {
            "text_offset": self._offsets(),
            "tokens": tokens,
            "token_logprobs": [None, *scores.log_probs],
            "top_logprobs": top,
        }

    def _offsets(self) -> list[int]:
        """Where each prompt token's text starts in the echoed text: the prompt decoded token
        by token, so that special tokens (a BOS) take no room and a piece's leading space or a
        character split over two tokens lands where the whole text has it."""
        detokenizer = IncrementalDetokenizer(self._tokenizer)
        offsets, offset = [], 0
        for token in self._ids:
            offsets.append(offset)
            offset += len(detokenizer.feed([token]))
        return offsets

    def join(self, generated: dict[str, Any]) -> dict[str, Any]:
        """The legacy log probs of a choice: the echoed prompt's entries, then `generated`."""
        prompt = self.legacy
        if prompt is None:
            return generated
        joined = {
            key: prompt[key] + generated[key] for key in ("text_offset", "tokens", "token_logprobs")
        }
        joined["top_logprobs"] = prompt["top_logprobs"] + (
            generated["top_logprobs"] or [None] * len(generated["tokens"])
        )
        return joined


def _check_best_of(request: CompletionRequest, candidates: int) -> None:
    if candidates < request.n:
        raise RequestError(
            f"best_of {candidates} is smaller than n {request.n}: it must be at least n",
            param="best_of",
        )
    if request.best_of is not None and candidates > MAX_RETURN_SEQUENCES:
        raise RequestError(f"best_of is at most {MAX_RETURN_SEQUENCES} here", param="best_of")
    if candidates > request.n and request.stream:
        raise RequestError(
            "best_of cannot be streamed: the best sequences are known only at the end "
            "(send stream false, or best_of equal to n)",
            param="best_of",
        )


def best_sequences(sequences: list[SequenceAnswer], n: int) -> list[SequenceAnswer]:
    """The n sequences of highest cumulative log probability, best first (all of them, in
    order, when there are no more than n)."""
    if len(sequences) <= n:
        return sequences
    ranked = sorted(sequences, key=lambda sequence: sequence.cum_log_prob, reverse=True)
    return ranked[:n]
