"""Pydantic schemas of the native API and the core result types shared by every API.

Limits that depend on the engine (prompt length, max_tokens, beam width) are checked later, in
:mod:`tensorrtllm_backend.generation`, where the engine's limits are known.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

UINT64_MAX = 2**64 - 1
MAX_STOP_WORDS = 16
MAX_BAD_WORDS = 64
MAX_WORD_CHARS = 256
MAX_PROMPT_CHARS = 1_000_000

Word = Annotated[str, StringConstraints(min_length=1, max_length=MAX_WORD_CHARS)]


class FinishReason(str, enum.Enum):
    STOP = "stop"  # end token or stop word
    LENGTH = "length"  # max_tokens reached
    CANCELLED = "cancelled"


class SamplingParams(BaseModel):
    """Generation parameters of the TensorRT-LLM contract (names as users know them)."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(256, ge=1, description="Maximum number of tokens to generate.")
    min_tokens: int | None = Field(
        None, ge=0, description="Generate at least this many tokens before the end token."
    )
    temperature: float | None = Field(
        None, ge=0.0, le=100.0, allow_inf_nan=False, description="0 means greedy."
    )
    top_k: int | None = Field(None, ge=0, description="Sample from the k most likely tokens.")
    top_p: float | None = Field(
        None, gt=0.0, le=1.0, allow_inf_nan=False, description="Nucleus sampling mass."
    )
    repetition_penalty: float | None = Field(None, gt=0.0, le=100.0, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    length_penalty: float | None = Field(None, ge=-10.0, le=10.0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, le=UINT64_MAX, description="Same seed, same output.")
    stop: list[Word] = Field(
        default_factory=list,
        max_length=MAX_STOP_WORDS,
        description="Strings that end generation; they are not returned.",
    )
    bad_words: list[Word] = Field(
        default_factory=list, max_length=MAX_BAD_WORDS, description="Strings never generated."
    )
    end_id: int | None = Field(None, ge=0, description="End token id (default: the tokenizer's).")
    pad_id: int | None = Field(None, ge=0, description="Pad token id (default: the tokenizer's).")
    beam_width: int = Field(1, ge=1, le=64, description="Beam search width (engine permitting).")
    return_log_probs: bool = Field(False, description="Return per-token log probabilities.")
    exclude_input_in_output: bool = Field(
        True, description="When false, the returned text starts with the prompt."
    )
    ignore_eos: bool = Field(False, description="Keep generating past the end token.")


class GenerateRequest(SamplingParams):
    """Input of the native `generate` / `generate_text` APIs."""

    prompt: str = Field(..., min_length=1, max_length=MAX_PROMPT_CHARS)
    lora: str | None = Field(
        None, max_length=128, description="Name of a LoRA adapter packed with the model."
    )

    @field_validator("prompt")
    @classmethod
    def _prompt_has_text(cls, prompt: str) -> str:
        if not prompt.strip():
            raise ValueError("prompt is blank: send some text to complete")
        return prompt


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class GenerateResponse(BaseModel):
    """Output of the native non-streaming API."""

    text: str
    finish_reason: FinishReason
    usage: Usage
    log_probs: list[float] | None = None
    cum_log_prob: float | None = None


@dataclass(slots=True)
class GenerationChunk:
    """One step of a generation: the text that became final and the tokens behind it."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] | None = None
    finish_reason: FinishReason | None = None
    # Tokens generated in this step. Equals len(token_ids) on the direct route; the text routes
    # count Triton responses (one per step) and their token_ids are the re-encoded text.
    token_count: int = 0


@dataclass(slots=True)
class GenerationResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason
    log_probs: list[float] | None = None
    log_prob_token_ids: list[int] | None = None  # the tokens behind log_probs

    def to_response(self) -> GenerateResponse:
        return GenerateResponse(
            text=self.text,
            finish_reason=self.finish_reason,
            usage=Usage(
                prompt_tokens=self.prompt_tokens,
                completion_tokens=self.completion_tokens,
                total_tokens=self.prompt_tokens + self.completion_tokens,
            ),
            log_probs=self.log_probs,
            cum_log_prob=sum(self.log_probs) if self.log_probs is not None else None,
        )
