"""The contract's tensors that the routes share (:mod:`.triton_paths.direct`, :mod:`.triton_paths.llmapi`,
:mod:`.triton_paths.text`): sampling, guide and LoRA inputs, and the outputs every engine response may
carry (sequence index, log probs and their alternatives).

Inputs carry the leading batch dimension of 1 that ``max_batch_size > 0`` models expect unless a
route builds them one-dimensional (``scalar`` is the function that makes each value); outputs
are read whatever their leading dimensions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..common.engine_api import EngineModelError, EngineResult
from .schemas import LOG_PROB_FLOOR, SamplingParams, TopLogProbs

NO_END_ID = -1  # TensorRT-LLM's "never stop on an end token"
TOP_OUTPUTS = ("output_top_token_ids", "output_top_log_probs")


def scalar(value: float | int | bool, dtype: type[np.generic]) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


Scalar = Callable[[float | int | bool, type[np.generic]], np.ndarray]


@dataclass(frozen=True, slots=True)
class LoraTensors:
    """An adapter as a request sends it: the C++ backend's task id with its weights on first
    use; the llmapi model's name and path (on this machine) with the id."""

    task_id: int
    weights: np.ndarray | None = None  # [1, N, D] float16, sent on first use
    config: np.ndarray | None = None  # [1, N, 3] int32
    name: str = ""
    path: str = ""

    def tensors(self) -> dict[str, np.ndarray]:
        tensors = {"lora_task_id": scalar(self.task_id, np.uint64)}
        if self.weights is not None and self.config is not None:
            tensors["lora_weights"] = self.weights
            tensors["lora_config"] = self.config
        return tensors


def sampling_values(params: SamplingParams) -> dict[str, tuple[object, type[np.generic]]]:
    """The optional sampling fields with their contract dtypes (value None: not set)."""
    return {
        "temperature": (params.temperature, np.float32),
        "top_k": (params.top_k, np.int32),
        "top_p": (params.top_p, np.float32),
        "repetition_penalty": (params.repetition_penalty, np.float32),
        "presence_penalty": (params.presence_penalty, np.float32),
        "frequency_penalty": (params.frequency_penalty, np.float32),
        "length_penalty": (params.length_penalty, np.float32),
        "min_tokens": (params.min_tokens, np.int32),
        "seed": (params.seed, np.uint64),
    }


def sampling_tensors(
    params: SamplingParams, names: dict[str, str], make: Scalar = scalar
) -> dict[str, np.ndarray]:
    """Optional sampling inputs; `names` maps our field names to the model's input names (the
    C++ backend's by default); `make` builds each value's tensor."""
    tensors = {
        names.get(field, field): make(value, dtype)  # type: ignore[arg-type]
        for field, (value, dtype) in sampling_values(params).items()
        if value is not None
    }
    if params.beam_width != 1:
        tensors[names.get("beam_width", "beam_width")] = make(params.beam_width, np.int32)
    if params.num_return_sequences != 1:  # only then: older engines lack this input
        name = names.get("num_return_sequences", "num_return_sequences")
        tensors[name] = make(params.num_return_sequences, np.int32)
    # An empty name: the model has no such input (the llmapi model takes both as one count).
    if params.return_log_probs and (name := names.get("return_log_probs", "return_log_probs")):
        tensors[name] = make(True, np.bool_)
    if params.top_log_probs and (name := names.get("top_log_probs", "top_log_probs")):
        tensors[name] = make(params.top_log_probs, np.int32)
    tensors.update(guided_tensors(params, make))
    return tensors


def _strings(value: str, make: Scalar) -> np.ndarray:
    return make(value.encode(), np.object_)  # type: ignore[arg-type]


def guided_tensors(params: SamplingParams, make: Scalar = scalar) -> dict[str, np.ndarray]:
    """`guided_decoding_guide_type` / `guided_decoding_guide` (STRING) of a guided request.

    The guide goes only with types that have one: TensorRT-LLM reads `json` without a guide as
    "any JSON", and an empty guide would not mean the same.
    """
    guided = params.guided_decoding
    if guided is None:
        return {}
    tensors = {"guided_decoding_guide_type": _strings(guided.type, make)}
    if guided.guide:
        tensors["guided_decoding_guide"] = _strings(guided.guide, make)
    return tensors


def optional_outputs(params: SamplingParams) -> list[str]:
    """Outputs the routes request only when the request needs them."""
    names = []
    if params.return_log_probs:
        names.append("output_log_probs")
    if params.top_log_probs:
        names += TOP_OUTPUTS
    if params.num_return_sequences != 1:
        names.append("sequence_index")
    return names


def engine_stop_words(stops: Sequence[str]) -> list[str]:
    """The stop strings as sent to the engine: each also with a leading space.

    The engine matches token ids, and a BPE tokenizer encodes a word inside a text with its
    leading space ("Ġwhen"), not as the word alone ("when"). With the space variant the engine ends
    the request where the service's text-level check cuts it, instead of running on until the
    service cancels it. The variant can only match where the text check has already cut (it
    contains the stop string), and one that never occurs costs nothing.
    """
    words = dict.fromkeys(stops)
    for stop in stops:
        if not stop[:1].isspace():
            words.setdefault(" " + stop)
    return list(words)


def sequence_index(result: EngineResult) -> int:
    """Which of the request's sequences a response belongs to (0 when not returned)."""
    index = result.values("sequence_index")
    return int(index[0]) if index else 0


def _floored(values: list[float]) -> list[float]:
    return [value if value > LOG_PROB_FLOOR else LOG_PROB_FLOOR for value in values]


def response_log_probs(result: EngineResult, count: int) -> list[float]:
    """The last `count` per-token log probs of beam 0 (empty when not requested)."""
    log_probs = result.values("output_log_probs")
    if not log_probs or count <= 0:
        return []
    return _floored(log_probs[-count:])


def response_top_log_probs(result: EngineResult, count: int, k: int) -> list[TopLogProbs]:
    """The alternatives of the last `count` tokens of beam 0: k ids and log probs each. An
    engine that sent fewer than asked for is an error, never a shorter list."""
    ids = result.values(TOP_OUTPUTS[0])
    values = result.values(TOP_OUTPUTS[1])
    if count <= 0:
        return []
    if (
        ids is None
        or values is None
        or len(ids) < count * k
        or len(ids) % k
        or len(ids) != len(values)
    ):
        raise EngineModelError(
            f"the engine returned no {k} alternatives for each of its {count} new tokens"
        )
    return _top_rows(ids, values, k, len(ids) - count * k)


def _top_rows(ids: list[int], values: list[float], k: int, start: int = 0) -> list[TopLogProbs]:
    """Flat alternatives from `start` on, as k ids and floored log probs per token."""
    return [
        (ids[row : row + k], _floored(values[row : row + k])) for row in range(start, len(ids), k)
    ]


@dataclass(frozen=True, slots=True)
class PromptLogProbs:
    """A prompt's scores: the log prob of each token after the first, and where asked for, the
    k most likely tokens at each of those positions (ids and log probs, the most likely
    first)."""

    log_probs: list[float]
    top: list[TopLogProbs] | None
    ranks: list[int]  # each token's rank at its position (1: the most likely)


def response_prompt_log_probs(
    result: EngineResult, names: Sequence[str], prompt_tokens: int, k: int
) -> PromptLogProbs | None:
    """The scores a response carries (`names`: its three outputs), None when it carries none;
    scores of another length than the prompt's are the engine's error, never a shorter list."""
    log_probs = result.values(names[0])
    if log_probs is None:
        return None
    if len(log_probs) != prompt_tokens - 1:
        raise EngineModelError(
            f"the engine scored {len(log_probs)} tokens of a {prompt_tokens}-token prompt "
            f"(expected {prompt_tokens - 1}: every token after the first)"
        )
    ranks = [int(rank) for rank in result.values(names[3]) or []]
    if len(ranks) != len(log_probs):
        raise EngineModelError("the engine returned no rank for each prompt token")
    if not k:
        return PromptLogProbs(_floored(log_probs), None, ranks)
    ids, values = result.values(names[1]) or [], result.values(names[2]) or []
    if len(ids) != len(log_probs) * k or len(values) != len(ids):
        raise EngineModelError(f"the engine returned no {k} alternatives per prompt token")
    return PromptLogProbs(_floored(log_probs), _top_rows(ids, values, k), ranks)
