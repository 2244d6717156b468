"""The contract's tensors that the engine routes share (:mod:`.routes.direct`,
:mod:`.routes.text`): sampling, guide and LoRA inputs, and the outputs every engine response may
carry (sequence index, log probs).

Every tensor carries the leading batch dimension of 1 that ``max_batch_size > 0`` models expect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import InferResult

from .schemas import SamplingParams

NO_END_ID = -1  # TensorRT-LLM's "never stop on an end token"


def scalar(value: float | int | bool, dtype: type[np.generic]) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


@dataclass(frozen=True, slots=True)
class LoraTensors:
    task_id: int
    weights: np.ndarray | None = None  # [1, N, D] float16, sent on first use
    config: np.ndarray | None = None  # [1, N, 3] int32

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


def sampling_tensors(params: SamplingParams, names: dict[str, str]) -> dict[str, np.ndarray]:
    """Optional sampling inputs; `names` maps our field names to the model's input names."""
    tensors = {
        names.get(field, field): scalar(value, dtype)  # type: ignore[arg-type]
        for field, (value, dtype) in sampling_values(params).items()
        if value is not None
    }
    if params.beam_width != 1:
        tensors["beam_width"] = scalar(params.beam_width, np.int32)
    if params.num_return_sequences != 1:  # only then: older engines lack this input
        tensors["num_return_sequences"] = scalar(params.num_return_sequences, np.int32)
    if params.return_log_probs:
        tensors["return_log_probs"] = scalar(True, np.bool_)
    tensors.update(guided_tensors(params))
    return tensors


def guided_tensors(params: SamplingParams) -> dict[str, np.ndarray]:
    """`guided_decoding_guide_type` / `guided_decoding_guide` (STRING [1, 1]) of a guided request.

    The guide goes only with types that have one: TensorRT-LLM reads `json` without a guide as
    "any JSON", and an empty guide would not mean the same.
    """
    guided = params.guided_decoding
    if guided is None:
        return {}
    tensors = {"guided_decoding_guide_type": np.array([[guided.type.encode()]], dtype=np.object_)}
    if guided.guide:
        tensors["guided_decoding_guide"] = np.array([[guided.guide.encode()]], dtype=np.object_)
    return tensors


def optional_outputs(params: SamplingParams) -> list[str]:
    """Outputs both routes request only when the request needs them."""
    names = []
    if params.return_log_probs:
        names.append("output_log_probs")
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


def sequence_index(result: InferResult) -> int:
    """Which of the request's sequences a response belongs to (0 when not returned)."""
    response = result.get_response()
    for index, output in enumerate(response.outputs):
        if output.name == "sequence_index":
            raw = response.raw_output_contents[index]
            return int.from_bytes(raw[:4], "little", signed=True) if raw else 0
    return 0


def response_log_probs(result: InferResult, count: int) -> list[float]:
    """The last `count` per-token log probs of beam 0 (empty when not requested)."""
    log_probs = result.as_numpy("output_log_probs")
    if log_probs is None or log_probs.size == 0 or count <= 0:
        return []
    return log_probs.reshape(-1)[-count:].astype(float).tolist()
