"""OpenAI's completions and chat completions over the chat core.

A chat request is prepared by the core (:meth:`ChatCore.prepare`); a completion is the core's
sampling and engine checks on a plain prompt, with OpenAI's own fields (echo, best_of, suffix).
Streamed and whole answers both come from the core's answer steps: a whole answer is the steps
collected (:func:`~..chat.stream.collect`) and rendered once.
"""

from __future__ import annotations

from ..apis import CHAT_LABEL, COMPLETIONS_LABEL
from ..chat.answer import Answer, ChatPlan
from ..chat.core import ChatCore
from ..chat.events import CallStart
from ..chat.output_format import output_constraint
from ..chat.stream import SequenceAnswer, WholeAnswer, answer_steps, collect
from ..generation import PreparedRequest
from ..request_errors import RequestError
from ..schemas import MAX_RETURN_SEQUENCES
from .protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
)
from .streams import LogProbs, StreamRenderer, finish_reason, openai_usage

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class OpenAIServing(StreamRenderer):
    """`/v1/completions` and `/v1/chat/completions` of the served model."""

    def __init__(self, core: ChatCore) -> None:
        self.core = core
        self.generator = core.generator
        self.model_name = core.model_name

    # -- preparing ---------------------------------------------------------------------------
    async def prepare_completion(
        self, request: CompletionRequest, size: int = 0
    ) -> PreparedRequest:
        """The core request of a completion (`size`: the request body's bytes)."""
        if request.suffix:
            raise RequestError("suffix is not supported", param="suffix")
        if request.echo and request.logprobs is not None:
            # Log probs of the generated tokens only, under an echoed prompt, read as the
            # prompt's by lm-evaluation-harness: every loglikelihood would come out 0.
            raise RequestError(
                "echo with logprobs asks for the prompt tokens' log probs, which this server does "
                "not compute yet: send echo or logprobs, not both",
                param="echo",
            )
        candidates = request.candidates
        _check_best_of(request, candidates)
        constraint = output_constraint(request)
        guide = constraint.guide if constraint else None
        # best_of ranks the sequences by their log probs: the engine returns them.
        params = self.core.sampling(
            request,
            request.logprobs is not None or candidates > request.n,
            guide,
            top_log_probs=request.logprobs or 0,
            default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
        )
        if candidates > request.n:
            params = params.model_copy(update={"num_return_sequences": candidates})
        if request.echo:
            params = params.model_copy(update={"exclude_input_in_output": False})
        param = constraint.param if constraint else None
        prompt: str = request.prompt  # type: ignore[assignment]
        return await self.core.admit(
            request, prompt, params, param, COMPLETIONS_LABEL, size, top_param="logprobs"
        )

    async def prepare_chat(
        self, request: ChatCompletionRequest, size: int = 0
    ) -> tuple[PreparedRequest, ChatPlan]:
        if request.reasoning_effort is not None:  # the template's variable; its own kwargs win
            template = {"reasoning_effort": request.reasoning_effort}
            template.update(request.chat_template_kwargs or {})
            request = request.model_copy(update={"chat_template_kwargs": template})
        return await self.core.prepare(request, size, CHAT_LABEL)

    # -- whole answers -----------------------------------------------------------------------
    async def complete(
        self, prepared: PreparedRequest, request: CompletionRequest | None = None
    ) -> CompletionResponse:
        """The whole answer; with `request`, its best_of: the n sequences of highest cumulative
        log probability among those generated (usage counts every one)."""
        answer = await collect(prepared, answer_steps(self.generator, prepared))
        return await self.generator.offloader.run(
            answer.render_size, self._completion_response, prepared, answer, request
        )

    def _completion_response(
        self,
        prepared: PreparedRequest,
        answer: WholeAnswer,
        request: CompletionRequest | None,
    ) -> CompletionResponse:
        want = prepared.params.return_log_probs
        sequences = answer.sequences
        if request is not None:
            want = request.logprobs is not None
            sequences = best_sequences(sequences, request.n)
        top = bool(prepared.params.top_log_probs)
        # text_offset counts from the start of the choice's text, which echo begins with the prompt
        offset = 0 if prepared.params.exclude_input_in_output else len(prepared.prompt)
        return CompletionResponse(
            id=f"cmpl-{prepared.request_id}",
            model=self.model_name,
            choices=[
                CompletionChoice(
                    index=position,
                    text=sequence.text,
                    finish_reason=finish_reason(sequence.finish_reason),
                    logprobs=self._log_probs_of(sequence, top).completion(offset) if want else None,
                )
                for position, sequence in enumerate(sequences)
            ],
            usage=openai_usage(answer.usage),
        )

    async def chat(
        self, prepared: PreparedRequest, plan: ChatPlan | None = None
    ) -> ChatCompletionResponse:
        reads = plan if plan is not None and plan.reads_text else None
        answer = await collect(prepared, answer_steps(self.generator, prepared, reads))
        return await self.generator.offloader.run(
            answer.render_size, self._chat_response, prepared, answer, reads is not None
        )

    def _chat_response(
        self, prepared: PreparedRequest, answer: WholeAnswer, read: bool
    ) -> ChatCompletionResponse:
        want = prepared.params.return_log_probs
        top = bool(prepared.params.top_log_probs)
        choices = []
        for sequence in answer.sequences:
            message = AssistantMessage(content=sequence.text)
            calls = False
            if read:
                whole = Answer.of(sequence.events)
                message = AssistantMessage(
                    content=whole.content,
                    tool_calls=whole.tool_calls or None,
                    reasoning_content=whole.reasoning,
                    reasoning=whole.reasoning,
                )
                calls = any(isinstance(event, CallStart) for event in sequence.events)
            choices.append(
                ChatChoice(
                    index=sequence.index,
                    message=message,
                    finish_reason=finish_reason(sequence.finish_reason, calls),
                    logprobs=self._log_probs_of(sequence, top).chat() if want else None,
                )
            )
        return ChatCompletionResponse(
            id=f"chatcmpl-{prepared.request_id}",
            model=self.model_name,
            choices=choices,
            usage=openai_usage(answer.usage),
        )

    def _log_probs_of(self, sequence: SequenceAnswer, top: bool) -> LogProbs:
        return self.log_probs(
            sequence.token_ids, sequence.log_probs, sequence.top_log_probs if top else None
        )


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
