"""The `llmapi` route: requests to NVIDIA's LLM-API `tensorrt_llm` model (text in, text out).

What differs from the engine routes:
- the model batches nothing at the Triton level (max_batch_size 0): tensors carry no batch
  dimension, `text_input` is [1] and every scalar [1];
- sampling goes in `sampling_param_*` inputs, and only those the LLM API model reads: a request
  that needs anything else is refused with a 400 (see :func:`check_request`);
- each streamed response carries the text so far (RequestOutput.text), not a delta, and the last
  one the `finish_reason` ("stop", "length", "cancelled"; "None" before);
- no token ids come back, so the service counts the completion with its own tokenizer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import InferResult

from ..request_errors import RequestError
from ..schemas import FinishReason, SamplingParams
from ..translation import LoraTensors, sampling_values
from .base import Decoded, EngineRoute, Route, RouteRequest

OUTPUTS = ["text_output", "finish_reason"]
_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "cancelled": FinishReason.CANCELLED,
    "timeout": FinishReason.CANCELLED,
}
# SamplingParams fields the llmapi model has no input for, with what to do instead.
_UNSUPPORTED: dict[str, str] = {
    "min_tokens": "min_tokens",
    "repetition_penalty": "repetition_penalty (use presence_penalty or frequency_penalty)",
    "length_penalty": "length_penalty (a beam-search setting)",
    "end_id": "end_id (the model ends at its tokenizer's end token)",
    "pad_id": "pad_id",
}


class LlmapiRequestError(RequestError):
    """What this workflow cannot do (HTTP 400); `param` names the field to change."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message, param=param)


def _refuse(what: str, param: str) -> LlmapiRequestError:
    return LlmapiRequestError(
        f"{what} is not available with the LLM API workflow: NVIDIA's llmapi model has no input "
        f"for it (serve engines, pack_model.py --workflow engine, for it); drop `{param}`",
        param,
    )


def check_request(params: SamplingParams, lora: str | None) -> None:
    """Raise LlmapiRequestError for what the llmapi model cannot serve (the API answers 400)."""
    for field, what in _UNSUPPORTED.items():
        if getattr(params, field) is not None:
            raise _refuse(what, field)
    if params.bad_words:
        raise _refuse("bad_words", "bad_words")
    if params.beam_width != 1:
        raise _refuse("beam search (beam_width > 1)", "beam_width")
    if params.num_return_sequences != 1:
        raise _refuse("several sequences per request", "num_return_sequences")
    if params.return_log_probs:
        raise _refuse("per-token log probs", "return_log_probs")
    if params.ignore_eos:
        raise _refuse("ignore_eos", "ignore_eos")
    if params.guided_decoding is not None:
        raise _refuse("guided decoding", "guided_decoding")
    if lora is not None:
        raise LlmapiRequestError(
            "LoRA adapters of the LLM API workflow are Hugging Face adapter directories given "
            "to the model as lora_name/lora_path on the serving machine; models packed with "
            "--workflow llmapi carry none: drop `lora`",
            "lora",
        )


# The sampling fields the llmapi model reads, each as `sampling_param_<field>`.
_SAMPLING = ("temperature", "top_k", "top_p", "presence_penalty", "frequency_penalty", "seed")


def _one(value: float | int | bool, dtype: type[np.generic]) -> np.ndarray:
    return np.array([value], dtype=dtype)


def tensors(prompt: str, params: SamplingParams) -> dict[str, np.ndarray]:
    """Inputs of the llmapi `tensorrt_llm` model: always streamed, prompt never echoed (the
    service prepends it itself when asked), finish reason requested."""
    values = sampling_values(params)
    sampling = {f"sampling_param_{field}": values[field] for field in _SAMPLING}
    inputs = {
        "text_input": np.array([prompt.encode()], dtype=np.object_),
        "streaming": _one(True, np.bool_),
        "sampling_param_max_tokens": _one(params.max_tokens, np.int32),
        "sampling_param_exclude_input_from_output": _one(True, np.bool_),
        "return_finish_reason": _one(True, np.bool_),
        **{
            name: _one(value, dtype)  # type: ignore[arg-type]
            for name, (value, dtype) in sampling.items()
            if value is not None
        },
    }
    if params.stop:
        inputs["sampling_param_stop"] = np.array([s.encode() for s in params.stop], np.object_)
    return inputs


def _string(result: InferResult, name: str) -> str | None:
    value = result.as_numpy(name)
    if value is None or value.size == 0:
        return None
    item = value.reshape(-1)[0]
    return item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)


class LlmapiDecoder:
    """llmapi responses -> (new text, token ids, token count, log probs), as the engine routes'
    decoders; plus the model's finish reason and a tokenizer count of the completion.

    A streamed response is one decoding step: its count is 1 once the text grew (a step whose
    token completes no character counts when a later one does). The final tally is the
    completion's size as `settle` finds it, since the model returns no token ids.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._text = ""
        self._pending = 0
        self.counted = 0
        self.finish_reason: FinishReason | None = None

    def __call__(self, result: InferResult) -> Decoded:
        reason = _string(result, "finish_reason")
        if reason in _REASONS:
            self.finish_reason = _REASONS[reason]
        text = _string(result, "text_output") or ""
        if not text.startswith(self._text):
            # The model revised text it had sent (a stop word trimmed at the end): what went out
            # stays out; the service's own stop-string check holds back such text.
            self._text = text
            return "", [], 0, None
        delta, self._text = text[len(self._text) :], text
        if not delta:
            self._pending += 1
            return "", [], 0, None
        count, self._pending = 1 + self._pending, 0
        self.counted += count
        return delta, [], count, None

    def flush(self) -> str:
        return ""

    def settle(self, max_tokens: int) -> int:
        """Tokens to add to what was counted so that the total is the completion's size (may be
        negative): max_tokens when the model ended for length, else the tokenizer's count of the
        text, at most max_tokens (re-encoding text is not the generation: a character split over
        byte tokens, shown as U+FFFD, re-encodes longer)."""
        if self.finish_reason is FinishReason.LENGTH:
            return max_tokens - self.counted
        total = len(self._tokenizer.encode(self._text, add_special_tokens=False))
        return min(total, max_tokens) - self.counted

    def finish(self, max_tokens: int, generated: int) -> tuple[int, FinishReason | None]:
        """The model says why it ended, and returns no token ids: the tokenizer counts them."""
        return self.settle(max_tokens), self.finish_reason


class LlmapiRoute(EngineRoute):
    """Text through NVIDIA's LLM-API `tensorrt_llm` model (the checkpoint workflow)."""

    route = Route.LLMAPI
    model_name = "tensorrt_llm"

    def check(self, params: SamplingParams, lora: str | None) -> None:
        check_request(params, lora)

    def inputs(
        self, request: RouteRequest, lora: LoraTensors | None
    ) -> tuple[dict[str, np.ndarray], list[str]]:
        return tensors(request.prompt, request.params), OUTPUTS

    def decoder(self, params: SamplingParams) -> LlmapiDecoder:
        return LlmapiDecoder(self.tokenizer)
