"""Pydantic models of the OpenAI API subset we serve. Unknown fields are accepted and ignored
(clients send many), but every field we act on is validated."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..schemas import MAX_PROMPT_CHARS, MAX_STOP_WORDS, MAX_WORD_CHARS, UINT64_MAX


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(OpenAIModel):
    include_usage: bool = False


class _SamplingFields(OpenAIModel):
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
    user: str | None = None
    # Extensions with TensorRT-LLM's names (as vLLM and trtllm-serve accept them).
    top_k: int | None = Field(None, ge=0)
    min_tokens: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=100.0, allow_inf_nan=False)
    ignore_eos: bool = False

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


class CompletionRequest(_SamplingFields):
    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[str]) -> str:
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise ValueError("send exactly one prompt per request (batches are not supported)")
            prompt = prompt[0]
        if not prompt.strip():
            raise ValueError("prompt is empty")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(f"prompt is longer than {MAX_PROMPT_CHARS} characters")
        return prompt


class ChatMessage(OpenAIModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

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


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "bentotrtllm"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
