"""OpenAI's chat completions over the chat core (completions: :mod:`.completions`).

A chat request is prepared by the core (:meth:`ChatCore.prepare`). Streamed and whole answers
both come from the core's answer steps: a whole answer is the steps collected
(:func:`~..chat.stream.collect`) and rendered once.
"""

from __future__ import annotations

from ..apis import CHAT_LABEL
from ..chat.answer import Answer, ChatPlan
from ..chat.core import ChatCore
from ..chat.events import CallStart
from ..chat.stream import SequenceAnswer, WholeAnswer, answer_steps, collect
from ..generation import PreparedRequest
from ..request_errors import RequestError
from .prompt_logprobs import vllm_prompt_logprobs
from .protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from .streams import LogProbs, StreamRenderer, finish_reason, openai_usage


class OpenAIServing(StreamRenderer):
    """`/v1/chat/completions` of the served model."""

    def __init__(self, core: ChatCore) -> None:
        self.core = core
        self.generator = core.generator
        self.model_name = core.model_name

    # -- preparing ---------------------------------------------------------------------------
    async def prepare_chat(
        self, request: ChatCompletionRequest, size: int = 0
    ) -> tuple[PreparedRequest, ChatPlan]:
        if request.reasoning_effort is not None:  # the template's variable; its own kwargs win
            template = {"reasoning_effort": request.reasoning_effort}
            template.update(request.chat_template_kwargs or {})
            request = request.model_copy(update={"chat_template_kwargs": template})
        if request.prompt_logprobs is not None and request.stream:
            raise RequestError(
                "prompt_logprobs are not streamed: send stream false", param="prompt_logprobs"
            )
        prepared, plan = await self.core.prepare(request, size, CHAT_LABEL)
        if request.prompt_logprobs is not None:
            self.generator.check_scoring(prepared, request.prompt_logprobs)
        return prepared, plan

    # -- whole answers -----------------------------------------------------------------------
    async def chat(
        self,
        prepared: PreparedRequest,
        plan: ChatPlan | None = None,
        prompt_logprobs: int | None = None,
    ) -> ChatCompletionResponse:
        """The whole answer; with `prompt_logprobs` (vLLM's), the rendered prompt's scores with
        that many alternatives per position."""
        scores = None
        if prompt_logprobs is not None:
            scores = await self.generator.score(prepared, prompt_logprobs)
        reads = plan if plan is not None and plan.reads_text else None
        answer = await collect(prepared, answer_steps(self.generator, prepared, reads))
        response = await self.generator.offloader.run(
            answer.render_size, self._chat_response, prepared, answer, reads is not None
        )
        if scores is not None:
            assert prompt_logprobs is not None
            response.prompt_logprobs = await self.generator.offloader.run(
                len(prepared.prompt_ids) * (prompt_logprobs + 1),
                vllm_prompt_logprobs, scores, prepared.prompt_ids, prompt_logprobs,
                self.generator.token_strings,
            )  # fmt: skip
        return response

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
