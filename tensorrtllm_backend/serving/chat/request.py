"""The chat request every chat-family API amounts to: a conversation in the shape chat templates
take (OpenAI's messages, tools and tool calls), the sampling fields, the output constraints.

OpenAI's chat completions take it as it is; the Responses API and Anthropic's Messages build one
from their own requests. Types are strict at this edge (`"stream": "yes"` or `"max_tokens": "10"`
is a 400). Fields no model here declares are accepted, and the route logs each such name once
(`unknown_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..schemas import MAX_STOP_WORDS, MAX_WORD_CHARS, UINT64_MAX

# OpenAI's rule for function and schema names.
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class RequestModel(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


def unknown_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted names of the fields a client sent that no model here declares (nested too)."""
    found = [f"{prefix}{name}" for name in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for position, item in enumerate(items):
            if isinstance(item, BaseModel):
                where = (
                    f"{prefix}{name}[{position}]."
                    if isinstance(value, list)
                    else f"{prefix}{name}."
                )
                found += unknown_fields(item, where)
    return found


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Where a streamed answer reports its usage (from stream_options)."""

    final: bool = False  # include_usage: a last chunk with the totals
    continuous: bool = False  # continuous_usage_stats: every chunk with the usage so far


class StreamOptions(RequestModel):
    include_usage: bool = False
    # vLLM's extension: usage so far in every chunk (with include_usage).
    continuous_usage_stats: bool = False


# --- response_format and vLLM's guided_* --------------------------------------------------------


class JsonSchemaFormat(RequestModel):
    name: str = Field(..., pattern=NAME_PATTERN)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('type "json_schema" needs json_schema: {"name": ..., "schema": {...}}')
        return self


class BookkeepingFields(RequestModel):
    """Fields of OpenAI's API that are accepted and have no effect on the answer."""

    user: str | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


class SamplingFields(BookkeepingFields):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, le=UINT64_MAX)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    store: bool | None = None  # accepted; nothing is stored
    # Extensions with TensorRT-LLM's names (as vLLM and trtllm-serve accept them).
    top_k: int | None = Field(None, ge=0)
    min_tokens: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=100.0, allow_inf_nan=False)
    ignore_eos: bool = False
    # vLLM's guided-decoding extensions (at most one constraint per request).
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> list[str]:
        words = [stop] if isinstance(stop, str) else list(stop or [])
        if len(words) > MAX_STOP_WORDS:
            raise ValueError(f"at most {MAX_STOP_WORDS} stop sequences are supported")
        for word in words:
            if not word:
                raise ValueError("stop sequences must not be empty")
            if len(word) > MAX_WORD_CHARS:
                raise ValueError(f"stop sequences must be at most {MAX_WORD_CHARS} characters")
        return words

    def usage_report(self) -> UsageReport:
        """Where a streamed answer reports usage: continuous_usage_stats counts with
        include_usage only, as in vLLM."""
        options = self.stream_options
        if options is None or not options.include_usage:
            return UsageReport()
        return UsageReport(final=True, continuous=options.continuous_usage_stats)


# --- tools --------------------------------------------------------------------------------------


class FunctionDefinition(RequestModel):
    name: str = Field(..., pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice

# Arguments of transformers' apply_chat_template that the service sets itself.
RENDERING_ARGUMENTS = frozenset(
    {
        "conversation", "messages", "tools", "documents", "chat_template", "tokenize",
        "add_generation_prompt", "continue_final_message", "padding", "truncation",
        "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)  # fmt: skip


class ToolCallFunction(RequestModel):
    name: str
    arguments: str


class ToolCall(RequestModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(RequestModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # What the official client sends back when an answer's message is put in the history as is.
    refusal: str | None = None
    annotations: list[dict[str, Any]] | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None
    # An assistant message's thinking, as answers carry it (vLLM's names, old and new).
    reasoning_content: str | None = None
    reasoning: str | None = None

    @model_validator(mode="after")
    def _tool_fields_fit_the_role(self) -> ChatMessage:
        if self.function_call is not None:
            raise ValueError("function_call is OpenAI's deprecated form of tool_calls: send those")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return self

    def text(self) -> str:
        """Plain text of the message; only text content parts are supported."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise ValueError(f"content parts of type {part.get('type')!r} are not supported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    # Variables of the chat template, e.g. {"enable_thinking": false} (vLLM's extension).
    chat_template_kwargs: dict[str, Any] | None = None
    # A cap on the thinking's tokens (a model that thinks): its end marker is written for it
    # when the cap is reached, and the answer follows. Anthropic's thinking.budget_tokens.
    thinking_budget: int | None = Field(None, ge=1)

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted(set(kwargs or ()) & RENDERING_ARGUMENTS)
        if taken:
            raise ValueError(
                f"{', '.join(taken)} cannot be set through chat_template_kwargs: they are "
                "arguments of the rendering, not variables of the template"
            )
        return kwargs
