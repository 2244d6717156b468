"""What a route is: the Triton model a request goes to, the checks only that model needs, the
tensors it is sent and how its responses become text.

:class:`~..generation.Generator` owns a request's lifecycle (validation against the engine,
the stream, stop strings, cancellation, metrics) and asks its route for everything that depends
on the model behind it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ...common.engine_api import EngineResult
from ...common.media import LoadedImage
from ..schemas import FinishReason, SamplingParams, TopLogProbs
from ..translation import LoraTensors


class Route(str, enum.Enum):
    """Which way through Triton a request takes."""

    DIRECT = "direct"  # service tokenizes; tensorrt_llm only
    ENSEMBLE = "ensemble"  # preprocessing → tensorrt_llm → postprocessing
    BLS = "bls"  # tensorrt_llm_bls python model
    LLMAPI = "llmapi"  # our LLM-API tensorrt_llm python model (checkpoint workflow)


ROUTE_MODELS = {
    Route.DIRECT: "tensorrt_llm",
    Route.ENSEMBLE: "ensemble",
    Route.BLS: "tensorrt_llm_bls",
    Route.LLMAPI: "tensorrt_llm",
}

PROMPT_SCORER = "prompt_logprobs"  # the engine workflow's scorer (all_models/.../prompt_logprobs)
PROMPT_OUTPUTS = (
    "prompt_log_probs",
    "prompt_top_token_ids",
    "prompt_top_log_probs",
    "prompt_token_ranks",
)
# Asked for beside them: the k most likely tokens after the prompt (the first generated token's).
PROMPT_NEXT_OUTPUTS = ("next_top_token_ids", "next_top_log_probs")

Decoded = tuple[str, list[int], int, list[float] | None, list[TopLogProbs] | None]
"""One response as (final text, token ids, token count, log probs, their alternatives)."""


class Decoder(Protocol):
    """Turns one sequence's responses into text as it becomes final."""

    def __call__(self, result: EngineResult) -> Decoded: ...

    def flush(self) -> str:
        """Text held back (a partial character) once the stream ended."""
        ...

    def finish(self, max_tokens: int, generated: int) -> tuple[int, FinishReason | None]:
        """Once the stream ended: tokens to add to the `generated` count (may be negative), and
        why the sequence ended, where the responses tell (None: it ended on its own)."""
        ...


class RouteRequest(Protocol):
    """What a route reads of a prepared request."""

    prompt: str
    params: SamplingParams
    prompt_ids: list[int]
    images: tuple[LoadedImage, ...]
    written_ids: list[int] | None


def image_tensor(request: RouteRequest, batched: bool) -> dict[str, np.ndarray]:
    """The `images` input of a request with images (their encoded bytes, as received and
    checked): the direct route's CPU engine ([1, n], a batched model) and the llmapi model
    ([n]) read it."""
    if not request.images:
        return {}
    data = np.array([image.data for image in request.images], dtype=np.object_)
    return {"images": data[None] if batched else data}


class EngineRoute:
    """One way through Triton; subclasses build its tensors and decode its responses."""

    route: Route
    # A TensorRT-LLM engine's KV-cache block size, where it is known (set by the Generator).
    tokens_per_block: int | None = None
    vocab_size: int | None = None  # the model's vocabulary, where the engine says
    model_name: str
    # Why this route returns one sequence per request (None: it returns several).
    single_sequence: str | None = None
    # Why this route returns no alternatives to the chosen tokens (None: its engine decides).
    no_top_log_probs: str | None = None
    # Whether a LoRA adapter's weights travel with its first request (the C++ backend's cache
    # protocol); the llmapi model reads adapters from their path instead.
    sends_lora_weights = True
    # Why this route cannot take a prompt as token ids (None: it can).
    no_token_prompts: str | None = None
    # Why this route's model takes no images (None: they go as the `images` input, encoded).
    no_images: str | None = (
        "images go to the model's tensorrt_llm model with the prompt's token ids: serve this "
        "model on the direct route (TRTLLM_ROUTE=direct) or pack it for the LLM API workflow"
    )

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def check(self, params: SamplingParams, lora: str | None) -> None:
        """Raise a RequestError for what this route's model cannot serve (before the engine's
        own limits are checked)."""

    def check_prepared(self, params: SamplingParams) -> None:
        """Raise a RequestError for what this route cannot serve of the final parameters."""

    def inputs(
        self, request: RouteRequest, lora: LoraTensors | None
    ) -> tuple[dict[str, np.ndarray], Sequence[str]]:
        """The request's input tensors and the outputs to ask for."""
        raise NotImplementedError

    def decoder(self, params: SamplingParams) -> Decoder:
        """A decoder for one of the request's sequences."""
        raise NotImplementedError

    def score_inputs(self, request: RouteRequest, k: int) -> tuple[str, dict[str, np.ndarray]]:
        """The model and tensors of a prompt-scoring request (the prompt tokens' log probs, and
        `k` alternatives at each position): the engine workflow's scorer beside the engine
        (the `prompt_logprobs` model), whatever route generates."""
        eos = self.tokenizer.eos_token_id
        tensors = {
            "input_ids": np.asarray(request.prompt_ids, dtype=np.int32),
            "top_log_probs": np.array([k], dtype=np.int32),
        }
        end_id = request.params.end_id if request.params.end_id is not None else eos
        if end_id is not None:
            tensors["end_id"] = np.array([end_id], dtype=np.int32)
        if self.vocab_size:
            tensors["vocab_size"] = np.array([self.vocab_size], dtype=np.int32)
        return PROMPT_SCORER, tensors

    def cached_tokens(self, last: EngineResult) -> int:
        """Prompt tokens the engine found in its KV cache, read from a request's last response
        (0: this engine does not tell): the LLM API model's `cached_tokens` output."""
        return output_int(last, "cached_tokens") or 0


def output_int(result: EngineResult, name: str) -> int | None:
    """A scalar integer output of a response, if it carries one."""
    values = result.values(name)
    return int(values[0]) if values else None


class StepDecoder:
    """Shared end of the engine routes' decoders: nothing held back unless a subclass says so,
    and a sequence that produced max_tokens ended for length."""

    def flush(self) -> str:
        return ""

    def finish(self, max_tokens: int, generated: int) -> tuple[int, FinishReason | None]:
        return 0, FinishReason.LENGTH if generated >= max_tokens else None
