"""What the llmapi model needs from an engine, in types that name no engine.

:class:`LlmEngine` is implemented by the adapter over `tensorrt_llm.LLM` (:mod:`.trtllm`) and by
the CPU stand-in (:mod:`.cpu`). A request goes in as an :class:`EngineRequest` whose
:class:`Sampling` fields carry `tensorrt_llm.SamplingParams`' own names; what comes back is a
:class:`Generation`, an async iterator of :class:`Step` (one per LLM-API yield) that can be
aborted. The model (:mod:`.model`) turns steps into Triton responses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from ..cpu_engine.request import TopLogprobs
from ..prompt_scores import PromptScores

FINISH_REASONS = ("stop", "length", "timeout", "cancelled", "not_finished")
"""CompletionOutput.finish_reason's values (None while a sequence runs)."""


@dataclass(frozen=True, slots=True)
class Guide:
    """A guided-decoding constraint with the C++ backend's type names (`json` without a guide:
    any JSON object; `json_schema`, `regex`, `ebnf_grammar`, `structural_tag` with one)."""

    type: str
    guide: str | None = None


@dataclass(frozen=True, slots=True)
class LoraSpec:
    """A LoRA adapter on the serving machine (the LLM API's LoRARequest fields)."""

    name: str
    int_id: int
    path: str
    ckpt_source: str = "hf"


@dataclass(slots=True)
class Sampling:
    """The SamplingParams fields a request sets; None leaves the engine's default.

    Field names are `tensorrt_llm.SamplingParams`' (the tensors are `sampling_param_<field>`),
    except `guide`, which becomes its `guided_decoding`.
    """

    max_tokens: int
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    length_penalty: float | None = None
    seed: int | None = None
    min_tokens: int | None = None
    n: int = 1
    best_of: int | None = None
    end_id: int | None = None
    pad_id: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    bad_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # alternatives per token; set, the chosen token's log prob too
    # Score the prompt: each token's log prob and this many alternatives at each position
    # (reduced from the context logits; not SamplingParams.prompt_logprobs, which leaves the
    # prompt's own token out when it is not among the top k).
    prompt_logprobs: int | None = None
    return_perf_metrics: bool = False
    detokenize: bool = True  # cumulative text in each step (text prompts need it)
    guide: Guide | None = None


@dataclass(slots=True)
class EngineRequest:
    """One Triton request for the engine: a text or token-id prompt and how to sample it."""

    prompt: str | list[int]
    sampling: Sampling
    streaming: bool = False
    lora: LoraSpec | None = None
    request_id: str = ""
    # A vision-language model's images (encoded, checked), in the order of the prompt's image
    # placeholders.
    images: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class PerfMetrics:
    """CompletionOutput.request_perf_metrics, by the names of NVIDIA's output tensors."""

    arrival_time_ns: int = 0
    first_scheduled_time_ns: int = 0
    first_token_time_ns: int = 0
    last_token_time_ns: int = 0
    kv_cache_reused_block: int = 0
    kv_cache_missed_block: int = 0
    kv_cache_alloc_new_blocks: int = 0
    kv_cache_alloc_total_blocks: int = 0
    kv_cache_hit_rate: float = 0.0
    acceptance_rate: float = 0.0
    total_accepted_draft_tokens: int = 0
    total_draft_tokens: int = 0


@dataclass(slots=True)
class SequenceStep:
    """One sequence (CompletionOutput) as of one step."""

    index: int
    token_ids: list[int]  # new since the previous step (token_ids_diff)
    text: str = ""  # everything so far ("" when not detokenized)
    logprobs: list[float] | None = None  # the chosen tokens', one per new token
    top: list[TopLogprobs] | None = None  # alternatives, one entry per new token
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    cumulative_logprob: float | None = None
    perf: PerfMetrics | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class Step:
    """What one LLM-API yield holds: every sequence of the request, in index order."""

    sequences: list[SequenceStep]
    finished: bool
    cached_tokens: int = 0  # prompt tokens reused from the KV cache
    prompt_scores: PromptScores | None = None  # with Sampling.prompt_logprobs, once known


class Generation(Protocol):
    """One request in flight."""

    def __aiter__(self) -> AsyncIterator[Step]:
        """The request's steps; the last one has `finished` set. A failure of this request
        raises RequestError (or another Exception) from the iteration."""
        ...

    def abort(self) -> None:
        """Stop generating; the iteration then ends with finish_reason "cancelled"."""
        ...


class LlmEngine(Protocol):
    """An engine behind the llmapi model: `tensorrt_llm.LLM`, or the CPU stand-in."""

    name: str  # for logs

    def generate(self, request: EngineRequest) -> Generation:
        """Start a request (called on the model's event loop); RequestError if it is refused."""
        ...

    def shutdown(self) -> None:
        """Stop the engine (the model is being unloaded)."""
        ...
