"""Pydantic schemas of the native API and the core result types shared by every API.

Limits that depend on the engine (prompt length, max_tokens, beam width) are checked later, in
:mod:`tensorrtllm_backend.serving.generation`, where the engine's limits are known.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

from _bentoml_sdk.io_models import IORootModel
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

UINT64_MAX = 2**64 - 1
MAX_STOP_WORDS = 16
MAX_BAD_WORDS = 64
MAX_WORD_CHARS = 256
MAX_PROMPT_CHARS = 1_000_000
MAX_RETURN_SEQUENCES = 64
MAX_GUIDE_CHARS = 256_000
MAX_TOP_LOG_PROBS = 20  # alternatives per token (OpenAI's top_logprobs limit)
# A log prob of a token the engine gives no chance (-inf): OpenAI's floor, as trtllm-serve and
# vLLM send it (JSON has no infinity).
LOG_PROB_FLOOR = -9999.0

TopLogProbs = tuple[list[int], list[float]]
"""One token's alternatives: their ids and log probs, the most likely first."""

Word = Annotated[str, StringConstraints(min_length=1, max_length=MAX_WORD_CHARS)]
TokenStrings = Callable[[list[int]], list[str]]
"""The text of each of a list of token ids."""


class FinishReason(str, enum.Enum):
    STOP = "stop"  # end token or stop word
    LENGTH = "length"  # max_tokens reached
    CANCELLED = "cancelled"


GuideType = Literal["json", "json_schema", "regex", "ebnf_grammar", "structural_tag"]


class GuidedDecoding(BaseModel):
    """A constraint on the generated text, TensorRT-LLM's `guided_decoding_guide_type` / `_guide`.

    `json` needs no guide (any JSON object); the others carry the schema, regex, EBNF grammar or
    structural tag as text.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    type: GuideType = Field(..., description="What kind of constraint `guide` holds.")
    guide: str | None = Field(
        None,
        max_length=MAX_GUIDE_CHARS,
        description="The JSON schema, regex, EBNF grammar or structural tag (JSON) as text.",
    )


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
    num_return_sequences: int = Field(
        1,
        ge=1,
        le=MAX_RETURN_SEQUENCES,
        description="Independent sequences to generate for the prompt (beam width 1; each takes "
        "a batch slot of the engine). Sequence i samples with seed + i.",
    )
    return_log_probs: bool = Field(False, description="Return per-token log probabilities.")
    top_log_probs: int = Field(
        0,
        ge=0,
        le=MAX_TOP_LOG_PROBS,
        description="With return_log_probs: also return this many most likely tokens at each "
        "position, with their log probabilities (engines that return them: the LLM API and the "
        "CPU engine).",
    )
    exclude_input_in_output: bool = Field(
        True, description="When false, the returned text starts with the prompt."
    )
    ignore_eos: bool = Field(False, description="Keep generating past the end token.")
    guided_decoding: GuidedDecoding | None = Field(
        None, description="Constrain the output to a JSON schema, regex or grammar."
    )

    @model_validator(mode="after")
    def _top_needs_log_probs(self) -> SamplingParams:
        if self.top_log_probs and not self.return_log_probs:
            raise ValueError("top_log_probs needs return_log_probs: true")
        return self


class PlainTextStream(IORootModel[str]):
    """What `/generate` streams: raw pieces of text, not server-sent events (BentoML labels a
    stream `text/event-stream` unless its output spec names another media type)."""

    media_type: ClassVar[str | None] = "text/plain"


class GenerateRequest(SamplingParams):
    """Input of the native `generate` / `generate_text` APIs.

    Strict, as the API edge: `"max_tokens": "10"` or `"ignore_eos": "yes"` is an error the client
    sees, not a value quietly converted (a JSON integer still fills a float field).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str = Field(..., min_length=1, max_length=MAX_PROMPT_CHARS)
    lora: str | None = Field(
        None, max_length=128, description="Name of a LoRA adapter packed with the model."
    )
    images: list[str] | None = Field(
        None,
        description="Images for a model that takes them: data: URIs (or http(s) URLs of "
        "TRTLLM_ALLOWED_MEDIA_DOMAINS' hosts); the prompt holds the model's image token "
        "(GET /v1/models: `image_token`) where each one stands.",
    )

    @field_validator("prompt")
    @classmethod
    def _prompt_has_text(cls, prompt: str) -> str:
        if not prompt.strip():
            raise ValueError("prompt is blank: send some text to complete")
        return prompt


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # found in the engine's KV cache (0 where the engine cannot tell)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None  # the OpenAI APIs report it


class TopLogProb(BaseModel):
    """One of the most likely tokens at a position."""

    token_id: int
    token: str
    log_prob: float


class GeneratedSequence(BaseModel):
    """One of several sequences generated for a prompt (num_return_sequences > 1)."""

    index: int
    text: str
    finish_reason: FinishReason
    completion_tokens: int
    log_probs: list[float] | None = None
    cum_log_prob: float | None = None
    top_log_probs: list[list[TopLogProb]] | None = None


class GenerateResponse(BaseModel):
    """Output of the native non-streaming API."""

    text: str
    finish_reason: FinishReason
    usage: Usage
    log_probs: list[float] | None = None
    cum_log_prob: float | None = None
    top_log_probs: list[list[TopLogProb]] | None = Field(
        None, description="top_log_probs > 0: the most likely tokens at each position."
    )
    sequences: list[GeneratedSequence] | None = Field(
        None,
        description="Every sequence when num_return_sequences > 1 (then `text`, "
        "`finish_reason` and `log_probs` are those of sequence 0, and usage counts all).",
    )


@dataclass(slots=True)
class GenerationChunk:
    """One step of a generation: the text that became final and the tokens behind it."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] | None = None
    top_log_probs: list[TopLogProbs] | None = None  # one entry per token, when asked for
    finish_reason: FinishReason | None = None
    # Tokens generated in this step. Equals len(token_ids) on the direct route; the text routes
    # count Triton responses (one per step) and their token_ids are the re-encoded text.
    token_count: int = 0
    index: int = 0  # which sequence (num_return_sequences > 1)
    stop: str | None = None  # on the last chunk: the stop string the sequence ended at
    cached_tokens: int = 0  # on the last chunk: prompt tokens found in the KV cache (0: unknown)
