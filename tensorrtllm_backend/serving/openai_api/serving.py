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
        return await self.core.prepare(request, size, CHAT_LABEL)

    # -- whole answers -----------------------------------------------------------------------
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
