"""Translate a prepared request into the contract's Triton tensors, and responses back.

Two routes through Triton share these helpers:
- ``direct``: the service tokenizes and calls the ``tensorrt_llm`` model with token ids;
- ``ensemble`` / ``bls``: text in, text out through NVIDIA's client-facing tensor names.
Every tensor carries the leading batch dimension of 1 that ``max_batch_size > 0`` models expect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import InferResult

from .schemas import SamplingParams

NO_END_ID = -1  # TensorRT-LLM's "never stop on an end token"


def _scalar(value: float | int | bool, dtype: type[np.generic]) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


@dataclass(frozen=True, slots=True)
class TokenIds:
    """What the engine-side request needs beyond the sampling parameters."""

    prompt_ids: Sequence[int]
    end_id: int
    pad_id: int
    stop_words_ids: np.ndarray | None = None  # [1, 2, L] contract layout
    bad_words_ids: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class LoraTensors:
    task_id: int
    weights: np.ndarray | None = None  # [1, N, D] float16, sent on first use
    config: np.ndarray | None = None  # [1, N, 3] int32

    def tensors(self) -> dict[str, np.ndarray]:
        tensors = {"lora_task_id": _scalar(self.task_id, np.uint64)}
        if self.weights is not None and self.config is not None:
            tensors["lora_weights"] = self.weights
            tensors["lora_config"] = self.config
        return tensors


def _sampling_tensors(params: SamplingParams, names: dict[str, str]) -> dict[str, np.ndarray]:
    """Optional sampling inputs; `names` maps our field names to the model's input names."""
    values: dict[str, tuple[object, type[np.generic]]] = {
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
    tensors = {
        names.get(field, field): _scalar(value, dtype)  # type: ignore[arg-type]
        for field, (value, dtype) in values.items()
        if value is not None
    }
    if params.beam_width != 1:
        tensors["beam_width"] = _scalar(params.beam_width, np.int32)
    if params.num_return_sequences != 1:  # only then: older engines lack this input
        tensors["num_return_sequences"] = _scalar(params.num_return_sequences, np.int32)
    if params.return_log_probs:
        tensors["return_log_probs"] = _scalar(True, np.bool_)
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


_DIRECT_NAMES = {
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "length_penalty": "len_penalty",
}


def direct_tensors(
    params: SamplingParams, ids: TokenIds, lora: LoraTensors | None = None
) -> dict[str, np.ndarray]:
    """Inputs of the ``tensorrt_llm`` model: always streamed, prompt excluded from the output."""
    tensors = {
        "input_ids": np.asarray([ids.prompt_ids], dtype=np.int32),
        "input_lengths": _scalar(len(ids.prompt_ids), np.int32),
        "request_output_len": _scalar(params.max_tokens, np.int32),
        "end_id": _scalar(NO_END_ID if params.ignore_eos else ids.end_id, np.int32),
        "pad_id": _scalar(ids.pad_id, np.int32),
        "streaming": _scalar(True, np.bool_),
        "exclude_input_in_output": _scalar(True, np.bool_),
        **_sampling_tensors(params, _DIRECT_NAMES),
    }
    if ids.stop_words_ids is not None and ids.stop_words_ids.shape[-1] > 0:
        tensors["stop_words_list"] = ids.stop_words_ids
    if ids.bad_words_ids is not None and ids.bad_words_ids.shape[-1] > 0:
        tensors["bad_words_list"] = ids.bad_words_ids
    if lora is not None:
        tensors.update(lora.tensors())
    return tensors


def _optional_outputs(params: SamplingParams) -> list[str]:
    """Outputs both routes request only when the request needs them."""
    names = []
    if params.return_log_probs:
        names.append("output_log_probs")
    if params.num_return_sequences != 1:
        names.append("sequence_index")
    return names


def direct_outputs(params: SamplingParams) -> list[str]:
    return ["output_ids", "sequence_length", *_optional_outputs(params)]


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


def text_tensors(
    prompt: str,
    params: SamplingParams,
    end_id: int | None,
    lora: LoraTensors | None = None,
    stop_words: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Inputs of the ``ensemble`` / ``tensorrt_llm_bls`` models (NVIDIA's client-facing names).

    stop_words: the `stop_words` tensor, default `params.stop`.
    """
    tensors = {
        "text_input": np.array([[prompt.encode()]], dtype=np.object_),
        "max_tokens": _scalar(params.max_tokens, np.int32),
        "stream": _scalar(True, np.bool_),
        "exclude_input_in_output": _scalar(True, np.bool_),
        **_sampling_tensors(params, {}),
    }
    if params.ignore_eos:
        tensors["end_id"] = _scalar(NO_END_ID, np.int32)
    elif end_id is not None:
        tensors["end_id"] = _scalar(end_id, np.int32)
    if params.pad_id is not None:
        tensors["pad_id"] = _scalar(params.pad_id, np.int32)
    stop_words = params.stop if stop_words is None else stop_words
    if stop_words:
        tensors["stop_words"] = np.array([[w.encode() for w in stop_words]], dtype=np.object_)
    if params.bad_words:
        tensors["bad_words"] = np.array([[w.encode() for w in params.bad_words]], dtype=np.object_)
    if lora is not None:
        tensors.update(lora.tensors())
    return tensors


def text_outputs(params: SamplingParams) -> list[str]:
    return ["text_output", *_optional_outputs(params)]


def new_token_ids(result: InferResult) -> list[int]:
    """Tokens of beam 0 in one streamed ``tensorrt_llm`` response.

    Read straight from the raw output bytes: this runs once per token, and building numpy
    arrays through ``as_numpy`` costs more than the few int32 values inside. Triton's raw
    tensors are little-endian, as is every platform TensorRT-LLM runs on.
    """
    response = result.get_response()
    ids = lengths = None
    beam_len = 0
    for index, output in enumerate(response.outputs):
        if output.name == "output_ids":
            ids = response.raw_output_contents[index]
            beam_len = output.shape[-1] if output.shape else 0
        elif output.name == "sequence_length":
            lengths = response.raw_output_contents[index]
    if not ids or not lengths or not beam_len:
        return []
    count = min(int.from_bytes(lengths[:4], "little", signed=True), beam_len)
    return memoryview(ids).cast("i")[:count].tolist()


def sequence_index(result: InferResult) -> int:
    """Which of the request's sequences a response belongs to (0 when not returned)."""
    response = result.get_response()
    for index, output in enumerate(response.outputs):
        if output.name == "sequence_index":
            raw = response.raw_output_contents[index]
            return int.from_bytes(raw[:4], "little", signed=True) if raw else 0
    return 0


def response_text(result: InferResult) -> str:
    output = result.as_numpy("text_output")
    if output is None or output.size == 0:
        return ""
    value = output.reshape(-1)[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def response_log_probs(result: InferResult, count: int) -> list[float]:
    """The last `count` per-token log probs of beam 0 (empty when not requested)."""
    log_probs = result.as_numpy("output_log_probs")
    if log_probs is None or log_probs.size == 0 or count <= 0:
        return []
    return log_probs.reshape(-1)[-count:].astype(float).tolist()
