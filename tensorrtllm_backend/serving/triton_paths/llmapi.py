"""The `llmapi` route: token ids in and out of our LLM-API `tensorrt_llm` model.

The same path as :mod:`.direct` (the service tokenizes, the model returns each step's new token
ids, :class:`~.direct.DirectDecoder` detokenizes them and counts them exactly); only the tensors
differ, since the llmapi model follows NVIDIA's llmapi model (max_batch_size 0: no batch
dimension, scalars are [1]) and names sampling fields `sampling_param_<SamplingParams field>`:
`input_ids` with an empty `text_input` (NVIDIA's model requires it), stop and bad words as
strings (the LLM API tokenizes them), the end and pad ids only where the request sets them (the
model's own tokenizer's otherwise), `sampling_param_logprobs` = the alternatives asked for
(0: the chosen token's log prob only), and NVIDIA's `lora_id` / `lora_name` / `lora_path`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..schemas import SamplingParams
from ..translation import LoraTensors, engine_stop_words, optional_outputs, sampling_tensors
from .base import EngineRoute, Route, RouteRequest, image_tensor
from .direct import DirectRoute

CACHED_TOKENS = "cached_tokens"  # prompt tokens the LLM API found in its KV cache
# Our SamplingParams fields by the llmapi model's input names; "" where it has none (the log
# probs travel as one count, sampling_param_logprobs).
_NAMES = {
    **{
        field: f"sampling_param_{field}"
        for field in (
            "temperature", "top_k", "top_p", "repetition_penalty", "presence_penalty",
            "frequency_penalty", "length_penalty", "min_tokens", "seed",
        )
    },
    "num_return_sequences": "sampling_param_n",
    "beam_width": "beam_width",  # never sent: the LLM API workflow's max_beam_width is 1
    "return_log_probs": "",
    "top_log_probs": "",
}  # fmt: skip


def one(value: object, dtype: type[np.generic]) -> np.ndarray:
    """A scalar input of a max_batch_size 0 model: shape [1]."""
    return np.array([value], dtype=dtype)


def _strings(words: Sequence[str]) -> np.ndarray:
    return np.array([word.encode() for word in words], dtype=np.object_)


def llmapi_tensors(
    params: SamplingParams, prompt_ids: Sequence[int], lora: LoraTensors | None = None
) -> dict[str, np.ndarray]:
    """Inputs of the llmapi model: always streamed, the prompt never echoed (the service
    prepends it itself when asked)."""
    tensors = {
        "text_input": _strings([""]),
        "input_ids": np.asarray(prompt_ids, dtype=np.int32),
        "streaming": one(True, np.bool_),
        "sampling_param_max_tokens": one(params.max_tokens, np.int32),
        "sampling_param_exclude_input_from_output": one(True, np.bool_),
        **sampling_tensors(params, _NAMES, one),
    }
    if params.return_log_probs:
        tensors["sampling_param_logprobs"] = one(params.top_log_probs, np.int32)
    if params.ignore_eos:
        tensors["sampling_param_ignore_eos"] = one(True, np.bool_)
    if params.end_id is not None:
        tensors["sampling_param_end_id"] = one(params.end_id, np.int32)
    if params.pad_id is not None:
        tensors["sampling_param_pad_id"] = one(params.pad_id, np.int32)
    if params.stop:
        tensors["sampling_param_stop"] = _strings(engine_stop_words(params.stop))
    if params.bad_words:
        tensors["sampling_param_bad"] = _strings(params.bad_words)
    if lora is not None:
        tensors["lora_id"] = one(lora.task_id, np.uint64)
        tensors["lora_name"] = _strings([lora.name])
        tensors["lora_path"] = _strings([lora.path])
    return tensors


class LlmapiRoute(DirectRoute):
    """Token ids through our LLM-API `tensorrt_llm` model (the checkpoint workflow)."""

    route = Route.LLMAPI
    model_name = "tensorrt_llm"
    sends_lora_weights = False

    def inputs(
        self, request: RouteRequest, lora: LoraTensors | None
    ) -> tuple[dict[str, np.ndarray], list[str]]:
        params = request.params
        outputs = ["output_ids", *optional_outputs(params), CACHED_TOKENS]
        # Images: the LLM API's input processor expands each placeholder itself.
        ids = request.written_ids if request.images and request.written_ids else request.prompt_ids
        tensors = llmapi_tensors(params, ids, lora)
        return {**tensors, **image_tensor(request, batched=False)}, outputs

    def score_inputs(self, request: RouteRequest, k: int) -> tuple[str, dict[str, np.ndarray]]:
        """The llmapi model scores a prompt itself: one greedy token, with
        `sampling_param_prompt_logprobs` = k (its adapter reduces the context logits beside the
        engine)."""
        params = request.params.model_copy(
            update={"max_tokens": 1, "return_log_probs": False, "top_log_probs": 0,
                    "num_return_sequences": 1, "stop": [], "guided_decoding": None,
                    "temperature": 0.0, "top_p": None, "top_k": None}
        )  # fmt: skip
        tensors = llmapi_tensors(params, request.prompt_ids)
        tensors["sampling_param_prompt_logprobs"] = one(k, np.int32)
        return self.model_name, tensors

    # The model's own count (each sequence's last response), not the C++ backend's blocks.
    cached_tokens = EngineRoute.cached_tokens
