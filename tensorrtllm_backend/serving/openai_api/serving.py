"""OpenAI requests → the shared generation core → OpenAI responses and SSE chunks.

Chat prompts are rendered with the tokenizer's own chat template (tools and tool results
included); streaming and non-streaming answers both come from :meth:`Generator.stream`. Output
constraints (response_format, guided_*, forced tool calls) become the core request's guide.
"""

from __future__ import annotations

import secrets
from typing import Any

from ...common.guides import GuideError
from ..apis import CHAT_LABEL, COMPLETIONS_LABEL
from ..generation import Generator, PreparedRequest, new_request_id
from ..request_errors import RequestError
from ..schemas import (
    MAX_RETURN_SEQUENCES,
    GenerationResult,
    GuidedDecoding,
    SamplingParams,
    SequenceResult,
)
from .answers import ChatPlan, ReasoningPlan, read_answer
from .protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
)
from .reasoning import reasoning_format
from .reasoning_guides import guide_after_reasoning
from .response_format import FormatError, OutputConstraint, output_constraint
from .streams import StreamingServing, call_finish_reason, finish_reason
from .tool_parsers import FORMATS, detect_format
from .tools import ToolError, ToolPlan, history_message, plan_tools

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
OPENAI_DEFAULT_TEMPERATURE = 1.0  # OpenAI samples when temperature is not given
CHAT_MAX_TOKENS_CAP = 4096  # chat without max_tokens: the engine's room, at most this


class OpenAIError(RequestError):
    """A request /v1 cannot serve as sent, with OpenAI's error type and code."""

    def __init__(
        self, message: str, status: int = 400, kind: str = "invalid_request_error",
        param: str | None = None, code: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message, status, param)
        self.kind, self.code = kind, code

    @classmethod
    def from_request_error(cls, error: RequestError, guide_param: str | None = None) -> OpenAIError:
        """`guide_param`: the OpenAI field the request's guide came from, named in its errors."""
        code = "context_length_exceeded" if error.param in ("prompt", "max_tokens") else None
        param = error.param
        if guide_param and param and param.startswith("guided_decoding"):
            param = guide_param
        return cls(str(error), error.status, param=param, code=code)


class OpenAIServing(StreamingServing):
    """Validates OpenAI requests against the served model and runs them on the generator."""

    def __init__(
        self,
        generator: Generator,
        model_name: str,
        stream_interval: int = 1,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
    ) -> None:
        """`tool_parser`: the model's tool-call format by name (TRTLLM_TOOL_PARSER); None: read
        from its chat template; "none": no tool calls are parsed. `reasoning_parser` likewise
        names how the model marks its thinking (TRTLLM_REASONING_PARSER)."""
        self.generator = generator
        self.model_name = model_name
        self.stream_interval = stream_interval  # SSE events per HTTP message after the first
        template = getattr(generator.tokenizer, "chat_template", None)
        texts = template.values() if isinstance(template, dict) else [template or ""]
        self.template_renders_tools = any("tools" in text for text in texts)
        if tool_parser is None:
            self.tool_format = detect_format(template)
        else:
            self.tool_format = None if tool_parser == "none" else FORMATS[tool_parser]
        self.reasoning_format = reasoning_format(reasoning_parser, template)

    # -- request translation --------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        """Tokens of a text as the model sees it (no special tokens added)."""
        return len(self.generator.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def model_names(self) -> list[str]:
        """The base model, then its LoRA adapters (a request names one as its `model`)."""
        return [self.model_name, *self.generator.loras.names()]

    def _lora(self, request: CompletionRequest | ChatCompletionRequest) -> str | None:
        """The adapter a request's `model` names (None for the base model)."""
        if request.model == self.model_name:
            return None
        if request.model in self.generator.loras.names():
            return request.model
        raise self.unknown_model(request.model)

    def unknown_model(self, name: str) -> OpenAIError:
        """The 404 for a model name this server does not serve."""
        return OpenAIError(
            f"model {name!r} does not exist here; this server serves "
            f"{', '.join(repr(n) for n in self.model_names())} (GET /v1/models)",
            404, "invalid_request_error", "model", "model_not_found",
        )  # fmt: skip

    def _check_common(self, request: CompletionRequest | ChatCompletionRequest) -> None:
        if request.n > MAX_RETURN_SEQUENCES:
            raise OpenAIError(
                f"n is at most {MAX_RETURN_SEQUENCES} here: send several requests", param="n"
            )

    def _sampling(
        self,
        request: CompletionRequest | ChatCompletionRequest,
        want_log_probs: bool,
        guide: GuidedDecoding | None = None,
        top_log_probs: int = 0,
    ) -> SamplingParams:
        temperature = request.temperature
        fields: dict[str, Any] = {
            "temperature": OPENAI_DEFAULT_TEMPERATURE if temperature is None else temperature,
            "top_p": request.top_p,
            "top_k": request.top_k,
            "presence_penalty": request.presence_penalty,
            "frequency_penalty": request.frequency_penalty,
            "repetition_penalty": request.repetition_penalty,
            "min_tokens": request.min_tokens,
            # OpenAI semantics: without a seed every request samples afresh (TensorRT-LLM's
            # default seed is 0, which would give every unseeded request the same text).
            "seed": request.seed if request.seed is not None else secrets.randbits(63),
            "stop": request.stop or [],
            "return_log_probs": want_log_probs,
            "top_log_probs": top_log_probs,
            "ignore_eos": request.ignore_eos,
            "num_return_sequences": request.n,
            "guided_decoding": guide,
        }
        max_tokens = request.max_completion_tokens or request.max_tokens
        if max_tokens is not None:
            fields["max_tokens"] = max_tokens
        elif isinstance(request, CompletionRequest):
            fields["max_tokens"] = COMPLETIONS_DEFAULT_MAX_TOKENS
        return SamplingParams(**{k: v for k, v in fields.items() if v is not None})

    async def _prepare(
        self,
        request: CompletionRequest | ChatCompletionRequest,
        prompt: str,
        params: SamplingParams,
        guide_param: str | None,
        api: str,
        size: int,
        **options: Any,
    ) -> PreparedRequest:
        """The core request of an OpenAI request (`options`: more arguments of
        :meth:`Generator.prepare`; `size`: the request body's bytes, which decide whether it is
        prepared off the event loop). A guide the engine could not enforce is a 400 quoting the
        compiler, before Triton sees the request (compiled in a thread, cached); every refusal
        names the OpenAI field, `guide_param` for the guide."""
        lora = self._lora(request)
        try:
            prepared = await self.generator.admit(
                prompt,
                params,
                new_request_id(),
                size=max(size, len(prompt)),
                api=api,
                lora=lora,
                **options,
            )
        except RequestError as error:
            if error.param == "top_log_probs":  # the OpenAI field that asked for alternatives
                error.param = "top_logprobs" if api == CHAT_LABEL else "logprobs"
            raise OpenAIError.from_request_error(error, guide_param) from None
        return prepared

    async def prepare_completion(
        self, request: CompletionRequest, size: int = 0
    ) -> PreparedRequest:
        self._check_common(request)
        if request.suffix:
            raise OpenAIError("suffix is not supported", param="suffix")
        candidates = request.candidates
        self._check_best_of(request, candidates)
        constraint = _constraint(request)
        guide = constraint.guide if constraint else None
        # best_of ranks the sequences by their log probs: the engine returns them.
        params = self._sampling(
            request,
            request.logprobs is not None or candidates > request.n,
            guide,
            top_log_probs=request.logprobs or 0,
        )
        if candidates > request.n:
            params = params.model_copy(update={"num_return_sequences": candidates})
        if request.echo:
            params = params.model_copy(update={"exclude_input_in_output": False})
        param = constraint.param if constraint else None
        prompt: str = request.prompt  # type: ignore[assignment]
        return await self._prepare(request, prompt, params, param, COMPLETIONS_LABEL, size)

    @staticmethod
    def _check_best_of(request: CompletionRequest, candidates: int) -> None:
        if candidates < request.n:
            raise OpenAIError(
                f"best_of {candidates} is smaller than n {request.n}: it must be at least n",
                param="best_of",
            )
        if candidates > MAX_RETURN_SEQUENCES:
            raise OpenAIError(f"best_of is at most {MAX_RETURN_SEQUENCES} here", param="best_of")
        if candidates > request.n and request.stream:
            raise OpenAIError(
                "best_of cannot be streamed: the best sequences are known only at the end "
                "(send stream false, or best_of equal to n)",
                param="best_of",
            )

    def render_chat(self, request: ChatCompletionRequest, plan: ToolPlan | None = None) -> str:
        """The prompt of a chat request, by the model's chat template (blocking, in proportion
        to the messages and tools: :meth:`prepare_chat` runs it off the loop when large);
        `chat_template_kwargs` (e.g. enable_thinking) are the template's own variables.

        The messages' own faults (a content part that is not text, tool-call arguments that are
        not JSON) and the template's refusals (jinja2's raise_exception: "roles must
        alternate"...) are the client's, a 400; anything else, a broken template included, is a
        server error."""
        tokenizer = self.generator.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise OpenAIError(
                "this model's tokenizer has no chat template: use /v1/completions, or pack the "
                "model with a tokenizer whose tokenizer_config.json has a chat_template",
                param="messages",
            )
        tools = plan.template_tools() if plan is not None else None
        try:
            messages = [history_message(m) for m in request.messages]
        except ValueError as error:
            raise OpenAIError(str(error), param="messages") from None
        import jinja2

        try:
            return str(
                tokenizer.apply_chat_template(
                    messages,
                    tools=tools,
                    tokenize=False,
                    add_generation_prompt=request.add_generation_prompt,
                    **(request.chat_template_kwargs or {}),
                )
            )
        except jinja2.TemplateSyntaxError:
            raise  # the model's template is broken: not the client's to fix
        except jinja2.TemplateError as error:
            raise OpenAIError(
                f"the chat template rejected the messages: {error}", param="messages"
            ) from None

    def plan_tools(self, request: ChatCompletionRequest) -> ToolPlan:
        """How the request's tools are used (a 400 for a combination that cannot be served)."""
        try:
            return plan_tools(request, self.tool_format, self.template_renders_tools)
        except ToolError as error:
            raise OpenAIError(str(error), param=error.param) from None

    async def prepare_chat(
        self, request: ChatCompletionRequest, size: int = 0, api: str = CHAT_LABEL
    ) -> tuple[PreparedRequest, ChatPlan]:
        """The core request and the plan its answer is read back with (tools, reasoning);
        `size`: the request body's bytes (a large request's tools and template are handled off
        the event loop); `api`: the metrics label of the API the request came from."""
        self._check_common(request)
        if request.top_logprobs is not None and not request.logprobs:
            raise OpenAIError("top_logprobs needs logprobs: true", param="top_logprobs")
        plan = await self.generator.offloader.run(size, self.plan_tools, request)
        constraint = _constraint(request)
        guide, guide_param = (constraint.guide, constraint.param) if constraint else (None, None)
        if plan.guide is not None:
            if constraint is not None:
                raise OpenAIError(
                    f"tool_choice {plan.mode!r} constrains the answer to a tool call, so it "
                    f"cannot be combined with {constraint.param}",
                    param=constraint.param,
                )
            guide, guide_param = plan.guide, "tools"
        elif constraint is not None and plan.parses_calls:
            plan = ToolPlan("none", plan.tools)  # the answer follows the requested format
        prompt = await self.generator.offloader.run(size, self.render_chat, request, plan)
        reasoning = self._reasoning(prompt)
        if (
            guide is not None
            and reasoning is not None
            and self.generator.guides_unsupported is None
        ):
            guide = self._guide_after_reasoning(guide, reasoning, guide_param)
        params = self._sampling(request, request.logprobs, guide, request.top_logprobs or 0)
        # The template already holds the special tokens (BOS) the model expects.
        prepared = await self._prepare(
            request, prompt, params, guide_param, api, size,
            add_special_tokens=False, max_tokens_cap=CHAT_MAX_TOKENS_CAP,
        )  # fmt: skip
        return prepared, ChatPlan(plan, reasoning)

    def _reasoning(self, prompt: str) -> ReasoningPlan | None:
        """How the answer to a rendered chat begins, for a model that thinks."""
        if self.reasoning_format is None:
            return None
        return ReasoningPlan(self.reasoning_format, self.reasoning_format.opening(prompt))

    @staticmethod
    def _guide_after_reasoning(
        guide: GuidedDecoding, reasoning: ReasoningPlan, param: str | None
    ) -> GuidedDecoding:
        """The request's guide enforced on the answer only, after the thinking."""
        try:
            return guide_after_reasoning(guide, reasoning.fmt, reasoning.opening)
        except GuideError as error:
            raise OpenAIError(str(error), param=param) from None

    # -- running -----------------------------------------------------------------------------
    async def complete(
        self, prepared: PreparedRequest, request: CompletionRequest | None = None
    ) -> CompletionResponse:
        """The whole answer; with `request`, its best_of: the n sequences of highest cumulative
        log probability among those generated (usage counts every one)."""
        result = await self.generator.collect(prepared)
        return await self.generator.offloader.run(
            result.render_size, self._completion_response, prepared, result, request
        )

    def _completion_response(
        self,
        prepared: PreparedRequest,
        result: GenerationResult,
        request: CompletionRequest | None,
    ) -> CompletionResponse:
        want = prepared.params.return_log_probs
        sequences = result.sequences
        if request is not None:
            want = request.logprobs is not None
            sequences = best_sequences(sequences, request.n)
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
                    logprobs=self._sequence_log_probs(sequence).completion(offset)
                    if want
                    else None,
                )
                for position, sequence in enumerate(sequences)
            ],
            usage=self._usage(prepared, result.completion_tokens, result.cached_tokens),
        )

    async def chat(
        self, prepared: PreparedRequest, plan: ChatPlan | None = None
    ) -> ChatCompletionResponse:
        result = await self.generator.collect(prepared)
        return await self.generator.offloader.run(
            result.render_size, self._chat_response, prepared, result, plan
        )

    def _chat_response(
        self, prepared: PreparedRequest, result: GenerationResult, plan: ChatPlan | None
    ) -> ChatCompletionResponse:
        want = prepared.params.return_log_probs
        return ChatCompletionResponse(
            id=f"chatcmpl-{prepared.request_id}",
            model=self.model_name,
            choices=[self._chat_choice(sequence, want, plan) for sequence in result.sequences],
            usage=self._usage(prepared, result.completion_tokens, result.cached_tokens),
        )

    def _chat_choice(
        self, sequence: SequenceResult, want_log_probs: bool, plan: ChatPlan | None
    ) -> ChatChoice:
        finish = finish_reason(sequence.finish_reason)
        message = AssistantMessage(content=sequence.text)
        if plan is not None and plan.reads_text:
            answer = read_answer(plan, sequence.text)
            message = AssistantMessage(
                content=answer.content,
                tool_calls=answer.tool_calls or None,
                reasoning_content=answer.reasoning,
                reasoning=answer.reasoning,
            )
            finish = call_finish_reason(finish, bool(answer.tool_calls))
        return ChatChoice(
            index=sequence.index,
            message=message,
            finish_reason=finish,
            logprobs=self._sequence_log_probs(sequence).chat() if want_log_probs else None,
        )


def best_sequences(sequences: list[SequenceResult], n: int) -> list[SequenceResult]:
    """The n sequences of highest cumulative log probability, best first (all of them, in
    order, when there are no more than n)."""
    if len(sequences) <= n:
        return sequences
    ranked = sorted(
        sequences,
        key=lambda sequence: sequence.cum_log_prob if sequence.cum_log_prob is not None else -1e30,
        reverse=True,
    )
    return ranked[:n]


def _constraint(request: CompletionRequest | ChatCompletionRequest) -> OutputConstraint | None:
    try:
        return output_constraint(request)
    except FormatError as error:
        raise OpenAIError(str(error), param=error.param) from None
