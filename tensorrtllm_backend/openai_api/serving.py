"""OpenAI requests → the shared generation core → OpenAI responses and SSE chunks.

Chat prompts are rendered with the tokenizer's own chat template (tools and tool results
included); streaming and non-streaming answers both come from :meth:`Generator.stream`. Output
constraints (response_format, guided_*, forced tool calls) become the core request's guide.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ..generation import Generator, PreparedRequest, RequestError, new_request_id
from ..schemas import (
    MAX_RETURN_SEQUENCES,
    FinishReason,
    GuidedDecoding,
    SamplingParams,
    SequenceResult,
)
from .protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    Usage,
)
from .response_format import FormatError, OutputConstraint, output_constraint
from .tool_parsers import FORMATS, detect_format
from .tool_stream import ToolStream
from .tools import ToolError, ToolPlan, extract_calls, history_message, plan_tools

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
OPENAI_DEFAULT_TEMPERATURE = 1.0  # OpenAI samples when temperature is not given
CHAT_MAX_TOKENS_CAP = 4096  # chat without max_tokens: the engine's room, at most this


class OpenAIError(Exception):
    """An error answered in OpenAI's error-object format."""

    def __init__(
        self, message: str, status: int = 400, kind: str = "invalid_request_error",
        param: str | None = None, code: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code

    @classmethod
    def from_request_error(cls, error: RequestError, guide_param: str | None = None) -> OpenAIError:
        """`guide_param`: the OpenAI field the request's guide came from, named in its errors."""
        code = "context_length_exceeded" if error.param in ("prompt", "max_tokens") else None
        param = error.param
        if guide_param and param and param.startswith("guided_decoding"):
            param = guide_param
        return cls(str(error), error.status, param=param, code=code)


def sse(payload: BaseModel | dict[str, Any] | str) -> str:
    if isinstance(payload, BaseModel):
        payload = payload.model_dump_json(exclude_none=True)
    elif isinstance(payload, dict):
        payload = json.dumps(payload)
    return f"data: {payload}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def _finish(reason: FinishReason | None) -> str | None:
    return None if reason is None else ("length" if reason is FinishReason.LENGTH else "stop")


def _call_finish(reason: str | None, calls: bool) -> str | None:
    """A sequence that ended on its own after calling tools finishes with "tool_calls"."""
    return "tool_calls" if calls and reason == "stop" else reason


@dataclass(slots=True)
class _Event:
    index: int
    text: str
    finish_reason: str | None
    token_ids: list[int]
    log_probs: list[float]
    token_count: int

    @classmethod
    def empty(cls, index: int) -> _Event:
        """Nothing gathered yet for sequence `index`."""
        return cls(index, "", None, [], [], 0)


class OpenAIServing:
    """Validates OpenAI requests against the served model and runs them on the generator."""

    def __init__(
        self,
        generator: Generator,
        model_name: str,
        stream_interval: int = 1,
        tool_parser: str | None = None,
    ) -> None:
        """`tool_parser`: the model's tool-call format by name (TRTLLM_TOOL_PARSER); None: read
        from its chat template; "none": no tool calls are parsed."""
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

    # -- request translation --------------------------------------------------------------
    def model_names(self) -> list[str]:
        """The base model, then its LoRA adapters (a request names one as its `model`)."""
        return [self.model_name, *self.generator.loras.names()]

    def _lora(self, request: CompletionRequest | ChatCompletionRequest) -> str | None:
        """The adapter a request's `model` names (None for the base model)."""
        if request.model == self.model_name:
            return None
        if request.model in self.generator.loras.names():
            return request.model
        raise OpenAIError(
            f"model {request.model!r} does not exist here; this server serves "
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

    async def _checked(self, prepared: PreparedRequest, guide_param: str | None) -> None:
        """A guide the engine could not enforce is a 400 quoting the compiler, before Triton
        sees the request (compiled in a thread, cached)."""
        try:
            await self.generator.check_guide(prepared)
        except RequestError as error:
            raise OpenAIError.from_request_error(error, guide_param) from None

    async def prepare_completion(self, request: CompletionRequest) -> PreparedRequest:
        self._check_common(request)
        if request.suffix:
            raise OpenAIError("suffix is not supported", param="suffix")
        constraint = _constraint(request)
        guide = constraint.guide if constraint else None
        params = self._sampling(request, request.logprobs is not None, guide)
        if request.echo:
            params = params.model_copy(update={"exclude_input_in_output": False})
        param = constraint.param if constraint else None
        try:
            prepared = self.generator.prepare(
                request.prompt,  # type: ignore[arg-type]
                params,
                new_request_id(),
                api="openai_completions",
                lora=self._lora(request),
            )
        except RequestError as error:
            raise OpenAIError.from_request_error(error, param) from None
        await self._checked(prepared, param)
        return prepared

    def render_chat(self, request: ChatCompletionRequest, plan: ToolPlan | None = None) -> str:
        tokenizer = self.generator.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise OpenAIError(
                "this model's tokenizer has no chat template: use /v1/completions, or pack the "
                "model with a tokenizer whose tokenizer_config.json has a chat_template",
                param="messages",
            )
        tools = plan.template_tools() if plan is not None else None
        if tools and not self.template_renders_tools:
            raise OpenAIError(
                "this model's chat template does not render tools, so the model would not see "
                "them: send the request without tools, or pack a tokenizer whose template has them",
                param="tools",
            )
        try:
            messages = [history_message(m) for m in request.messages]
            return str(
                tokenizer.apply_chat_template(
                    messages,
                    tools=tools,
                    tokenize=False,
                    add_generation_prompt=request.add_generation_prompt,
                )
            )
        except ValueError as error:
            raise OpenAIError(str(error), param="messages") from None
        except Exception as error:  # template errors (jinja2 raise_exception) are user errors
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
        self, request: ChatCompletionRequest
    ) -> tuple[PreparedRequest, ToolPlan]:
        """The core request and the tool plan its answer is read back with."""
        self._check_common(request)
        if request.top_logprobs:
            raise OpenAIError(
                "top_logprobs is not available: TensorRT-LLM returns the chosen token's log "
                "probability only (use logprobs=true)",
                param="top_logprobs",
            )
        plan = self.plan_tools(request)
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
        prompt = self.render_chat(request, plan)
        params = self._sampling(request, request.logprobs, guide)
        try:
            # The template already holds the special tokens (BOS) the model expects.
            prepared = self.generator.prepare(
                prompt, params, new_request_id(), add_special_tokens=False,
                max_tokens_cap=CHAT_MAX_TOKENS_CAP, api="openai_chat", lora=self._lora(request),
            )  # fmt: skip
        except RequestError as error:
            raise OpenAIError.from_request_error(error, guide_param) from None
        await self._checked(prepared, guide_param)
        return prepared, plan

    # -- running -----------------------------------------------------------------------------
    def _token_strings(self, token_ids: list[int]) -> list[str]:
        return [self.generator.tokenizer.decode([t]) for t in token_ids]

    def _usage(self, prepared: PreparedRequest, completion_tokens: int) -> Usage:
        prompt = len(prepared.prompt_ids)
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=completion_tokens,
            total_tokens=prompt + completion_tokens,
        )

    def _sequence_tokens(self, sequence: SequenceResult) -> list[str]:
        """The token strings behind a gathered sequence's log probs."""
        return self._token_strings(sequence.log_prob_token_ids or [])

    async def complete(self, prepared: PreparedRequest) -> CompletionResponse:
        want = prepared.params.return_log_probs
        result = await self.generator.collect(prepared)
        return CompletionResponse(
            id=f"cmpl-{prepared.request_id}",
            model=self.model_name,
            choices=[
                CompletionChoice(
                    index=sequence.index,
                    text=sequence.text,
                    finish_reason=_finish(sequence.finish_reason),
                    logprobs=self._completion_log_probs(
                        self._sequence_tokens(sequence), sequence.log_probs
                    )
                    if want
                    else None,
                )
                for sequence in result.sequences
            ],
            usage=self._usage(prepared, result.completion_tokens),
        )

    async def chat(
        self, prepared: PreparedRequest, plan: ToolPlan | None = None
    ) -> ChatCompletionResponse:
        want = prepared.params.return_log_probs
        result = await self.generator.collect(prepared)
        return ChatCompletionResponse(
            id=f"chatcmpl-{prepared.request_id}",
            model=self.model_name,
            choices=[self._chat_choice(sequence, want, plan) for sequence in result.sequences],
            usage=self._usage(prepared, result.completion_tokens),
        )

    def _chat_choice(
        self, sequence: SequenceResult, want_log_probs: bool, plan: ToolPlan | None
    ) -> ChatChoice:
        finish = _finish(sequence.finish_reason)
        message = AssistantMessage(content=sequence.text)
        if plan is not None and plan.parses_calls:
            calls = extract_calls(plan, sequence.text)
            message = AssistantMessage(content=calls.content, tool_calls=calls.tool_calls or None)
            finish = _call_finish(finish, bool(calls.tool_calls))
        return ChatChoice(
            index=sequence.index,
            message=message,
            finish_reason=finish,
            logprobs=self._chat_log_probs(self._sequence_tokens(sequence), sequence.log_probs)
            if want_log_probs
            else None,
        )

    @staticmethod
    def _completion_log_probs(tokens: list[str], log_probs: list[float] | None) -> dict[str, Any]:
        return {"tokens": tokens, "token_logprobs": log_probs, "top_logprobs": None}

    @staticmethod
    def _chat_log_probs(tokens: list[str] | None, log_probs: list[float] | None) -> dict[str, Any]:
        pairs = zip(tokens or [], log_probs or [], strict=False)
        return {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in pairs
            ]
        }

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
                event.token_count += chunk.token_count
                if chunk.text or chunk.finish_reason is not None:
                    event.text, event.finish_reason = chunk.text, _finish(chunk.finish_reason)
                    yield event
                    pending[chunk.index] = _Event.empty(chunk.index)

    async def stream_completion(
        self, prepared: PreparedRequest, include_usage: bool
    ) -> AsyncIterator[str]:
        events_out = _ChunkEvents("text_completion", f"cmpl-{prepared.request_id}", self.model_name)
        want = prepared.params.return_log_probs
        completion_tokens = 0
        async with aclosing(self._events(prepared)) as events:
            async for event in events:
                completion_tokens += event.token_count
                logprobs = (
                    self._completion_log_probs(
                        self._token_strings(event.token_ids), event.log_probs
                    )
                    if want and event.token_ids
                    else None
                )
                yield events_out.choice(
                    event.index,
                    f'"text":{_json(event.text)},"finish_reason":{_json(event.finish_reason)},'
                    f'"logprobs":{_json(logprobs)}',
                )
        if include_usage:
            yield events_out.usage(self._usage(prepared, completion_tokens))
        yield SSE_DONE

    async def stream_chat(
        self, prepared: PreparedRequest, include_usage: bool, plan: ToolPlan | None = None
    ) -> AsyncIterator[str]:
        if plan is not None and plan.parses_calls:
            async for event in self._stream_chat_calls(prepared, include_usage, plan):
                yield event
            return
        events_out = _ChunkEvents(
            "chat.completion.chunk", f"chatcmpl-{prepared.request_id}", self.model_name
        )
        want = prepared.params.return_log_probs
        completion_tokens = 0
        role_sent: set[int] = set()
        async with aclosing(self._events(prepared)) as events:
            async for event in events:
                if event.index not in role_sent:  # once Triton answered: failures get a status
                    yield events_out.choice(
                        event.index,
                        '"delta":{"role":"assistant","content":""},"finish_reason":null',
                    )
                    role_sent.add(event.index)
                completion_tokens += event.token_count
                logprobs = (
                    self._chat_log_probs(self._token_strings(event.token_ids), event.log_probs)
                    if want and event.token_ids
                    else None
                )
                yield events_out.choice(
                    event.index,
                    f'"delta":{{"content":{_json(event.text)}}},'
                    f'"finish_reason":{_json(event.finish_reason)},"logprobs":{_json(logprobs)}',
                )
        if include_usage:
            yield events_out.usage(self._usage(prepared, completion_tokens))
        yield SSE_DONE

    async def _stream_chat_calls(
        self, prepared: PreparedRequest, include_usage: bool, plan: ToolPlan
    ) -> AsyncIterator[str]:
        """stream_chat for answers that may call tools: each sequence's text goes through its
        tool-call extractor, whose deltas are sent as they become certain."""
        events_out = _ChunkEvents(
            "chat.completion.chunk", f"chatcmpl-{prepared.request_id}", self.model_name
        )
        want = prepared.params.return_log_probs
        completion_tokens = 0
        streams: dict[int, ToolStream] = {}
        async with aclosing(self._events(prepared)) as events:
            async for event in events:
                stream = streams.get(event.index)
                if stream is None:
                    stream = streams[event.index] = ToolStream(plan.parser())
                    yield events_out.choice(
                        event.index,
                        '"delta":{"role":"assistant","content":""},"finish_reason":null',
                    )
                completion_tokens += event.token_count
                logprobs = (
                    self._chat_log_probs(self._token_strings(event.token_ids), event.log_probs)
                    if want and event.token_ids
                    else None
                )
                final = event.finish_reason is not None
                deltas = stream.deltas(event.text, final)
                if logprobs is not None and not deltas:
                    deltas = ['{"content":""}']
                for delta in deltas:
                    yield events_out.choice(
                        event.index,
                        f'"delta":{delta},"finish_reason":null,"logprobs":{_json(logprobs)}',
                    )
                    logprobs = None
                if final:
                    finish = _call_finish(event.finish_reason, stream.calls > 0)
                    yield events_out.choice(
                        event.index, f'"delta":{{}},"finish_reason":{_json(finish)}'
                    )
        if include_usage:
            yield events_out.usage(self._usage(prepared, completion_tokens))
        yield SSE_DONE


def _constraint(request: CompletionRequest | ChatCompletionRequest) -> OutputConstraint | None:
    try:
        return output_constraint(request)
    except FormatError as error:
        raise OpenAIError(str(error), param=error.param) from None


_json = json.dumps


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
