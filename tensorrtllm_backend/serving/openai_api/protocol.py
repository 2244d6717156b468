"""Pydantic models of OpenAI's completions and chat completions as served here: the chat request
is the chat core's (:mod:`..chat.request`); completions add their prompt, and the answers are
OpenAI's objects.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from ..chat.request import ChatRequest, RequestModel, SamplingFields, ToolCall
from ..field_policy import FieldTable
from ..schemas import MAX_PROMPT_CHARS, Usage
from .fields import CHAT_FIELDS, COMPLETIONS_FIELDS


class _OpenAIHints(RequestModel):
    """OpenAI fields that steer nothing here (their policies: :mod:`.fields`)."""

    prediction: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None

    def refused_by(self, table: FieldTable, n: int) -> tuple[str, str] | None:
        """The first field sent that `table` refuses, with what to do instead."""
        refused = table.first_refused(self, neutral={"best_of": n, "modalities": ["text"]})
        if refused is not None:
            return refused
        if getattr(self, "stream_options", None) is not None and not self.stream:
            return "stream_options", "stream_options is only allowed with stream: true"
        return None


class ChatCompletionRequest(ChatRequest, _OpenAIHints):
    """OpenAI's chat completions: the chat core's request, and OpenAI's own fields."""

    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    # vLLM's: the rendered prompt's token log probs, with this many alternatives per position.
    prompt_logprobs: int | None = Field(None, ge=0, le=20)

    def unsupported(self) -> tuple[str, str] | None:
        return self.refused_by(CHAT_FIELDS, self.n)


MAX_COMPLETION_PROMPTS = 256  # prompts in one /v1/completions request (a batch)
Prompt = str | list[int]
"""One prompt of a completion request: text, or token ids."""


class CompletionRequest(SamplingFields, _OpenAIHints):
    # A string, strings, token ids or lists of token ids; `prompts` is the list of prompts.
    prompt: str | list[str] | list[int] | list[list[int]]
    # 0 with echo scores the prompt without generating.
    max_tokens: int | None = Field(None, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    # vLLM's: the prompt tokens' log probs, with this many alternatives at each position.
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    # vLLM's: a text prompt with the tokenizer's special tokens (None: the server's setting).
    add_special_tokens: bool | None = None
    suffix: str | None = None
    # Sequences generated to answer the n most likely (by cumulative log probability).
    best_of: int | None = Field(None, ge=1)

    @property
    def candidates(self) -> int:
        """Sequences to generate: best_of, or n."""
        return self.best_of or self.n

    @property
    def prompts(self) -> list[Prompt]:
        """The prompts of the batch, in order (one for a string or a list of token ids)."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]  # type: ignore[list-item]
        return list(prompt)  # type: ignore[arg-type]

    def unsupported(self) -> tuple[str, str] | None:
        return self.refused_by(COMPLETIONS_FIELDS, self.n)

    @field_validator("prompt")
    @classmethod
    def _check_prompts(
        cls, prompt: str | list[str] | list[int] | list[list[int]]
    ) -> str | list[str] | list[int] | list[list[int]]:
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompts: list[Prompt] = [prompt]  # type: ignore[list-item]
        else:
            prompts = list(prompt)  # type: ignore[arg-type]
        if not prompts:
            raise ValueError("prompt is an empty list: send a string, strings or token ids")
        if len(prompts) > MAX_COMPLETION_PROMPTS:
            raise ValueError(
                f"{len(prompts)} prompts in one request; at most {MAX_COMPLETION_PROMPTS} are "
                "served per request: split the batch"
            )
        for position, one in enumerate(prompts):
            where = f"prompt {position}" if len(prompts) > 1 else "prompt"
            if isinstance(one, str):
                if not one.strip():
                    raise ValueError(f"{where} is empty")
                if len(one) > MAX_PROMPT_CHARS:
                    raise ValueError(f"{where} is longer than {MAX_PROMPT_CHARS} characters")
            elif not one:
                raise ValueError(f"{where} holds no token ids")
        return prompt


class _Choice(BaseModel):
    index: int = 0
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class _Response(BaseModel):
    """What every non-streamed answer starts with; `object` names the kind."""

    id: str
    object: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


class CompletionChoice(_Choice):
    text: str
    # vLLM's prompt_logprobs: null for the first token, then {token id: entry} per token.
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None


class CompletionResponse(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None

    def to_json(self) -> dict[str, Any]:
        """Absent optional fields left out (the null entries inside log probs stay)."""
        return self.model_dump(exclude_none=True)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None
    # The thinking of a reasoning model (`reasoning_content` as trtllm-serve and SGLang name
    # it, `reasoning` as vLLM does).
    reasoning_content: str | None = None
    reasoning: str | None = None


class ChatChoice(_Choice):
    message: AssistantMessage


class ChatCompletionResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None  # vLLM's

    def to_json(self) -> dict[str, Any]:
        """Absent optional fields left out, except a message's content: null is OpenAI's answer
        when the assistant only calls tools."""
        body = self.model_dump(exclude_none=True)
        for choice in body["choices"]:
            choice["message"].setdefault("content", None)
        return body


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "bentotrtllm"
    # The packed model's quantization (algorithm, group size, KV-cache format), where it has one.
    quantization: dict[str, Any] | None = None
    # A model that takes images: the token a native prompt marks each image's place with.
    image_token: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
