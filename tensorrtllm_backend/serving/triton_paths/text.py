"""The `ensemble` and `bls` routes: text in, text out through NVIDIA's client-facing tensor names.

Both send the prompt as `text_input` and read `text_output` deltas; they differ in the model
they call and in the stop words they send (see :class:`EnsembleRoute`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...common.engine_api import EngineResult
from ..schemas import SamplingParams
from ..translation import (
    NO_END_ID,
    LoraTensors,
    engine_stop_words,
    optional_outputs,
    response_log_probs,
    sampling_tensors,
    scalar,
)
from .base import Decoded, EngineRoute, Route, RouteRequest, StepDecoder


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
        "max_tokens": scalar(params.max_tokens, np.int32),
        "stream": scalar(True, np.bool_),
        "exclude_input_in_output": scalar(True, np.bool_),
        **sampling_tensors(params, {}),
    }
    if params.ignore_eos:
        tensors["end_id"] = scalar(NO_END_ID, np.int32)
    elif end_id is not None:
        tensors["end_id"] = scalar(end_id, np.int32)
    if params.pad_id is not None:
        tensors["pad_id"] = scalar(params.pad_id, np.int32)
    stop_words = params.stop if stop_words is None else stop_words
    if stop_words:
        tensors["stop_words"] = np.array([[w.encode() for w in stop_words]], dtype=np.object_)
    if params.bad_words:
        tensors["bad_words"] = np.array([[w.encode() for w in params.bad_words]], dtype=np.object_)
    if lora is not None:
        tensors.update(lora.tensors())
    return tensors


def text_outputs(params: SamplingParams) -> list[str]:
    return ["text_output", *optional_outputs(params)]


def response_text(result: EngineResult) -> str:
    text = result.values("text_output")
    return str(text[0]) if text else ""


class TextDecoder(StepDecoder):
    """ensemble / BLS responses carry text only. A streamed response is one decoding step, i.e.
    one token (beam 1); a response without text counts once a later one arrives, since the last
    response of a stream may be an empty final one. The token ids are the re-encoded text
    (used for log-prob token strings only)."""

    def __init__(self, tokenizer: Any, want_log_probs: bool) -> None:
        self._tokenizer = tokenizer
        self._want_log_probs = want_log_probs
        self._pending = 0

    def __call__(self, result: EngineResult) -> Decoded:
        text = response_text(result)
        if not text:
            self._pending += 1
            return "", [], 0, None, None
        count, self._pending = 1 + self._pending, 0
        ids = self._tokenizer.encode(text, add_special_tokens=False) if self._want_log_probs else []
        log_probs = response_log_probs(result, count) if self._want_log_probs else None
        return text, ids, count, log_probs, None


class TextRoute(EngineRoute):
    """Text through a Triton model that tokenizes and detokenizes itself."""

    no_top_log_probs = (
        "top log probs are returned on the direct route (TRTLLM_ROUTE=direct): NVIDIA's "
        "ensemble and BLS models pass no alternatives through"
    )
    no_token_prompts = (
        "prompts as token ids are served on the direct route (TRTLLM_ROUTE=direct): the "
        "ensemble and BLS models tokenize text themselves"
    )

    def stop_words(self, stops: Sequence[str]) -> Sequence[str] | None:
        """The `stop_words` tensor's words (None: the request's stop strings as sent)."""
        return None

    def inputs(
        self, request: RouteRequest, lora: LoraTensors | None
    ) -> tuple[dict[str, np.ndarray], list[str]]:
        params = request.params
        stop_words = self.stop_words(params.stop)
        tensors = text_tensors(request.prompt, params, params.end_id, lora, stop_words)
        return tensors, text_outputs(params)

    def decoder(self, params: SamplingParams) -> TextDecoder:
        return TextDecoder(self.tokenizer, params.return_log_probs)


class EnsembleRoute(TextRoute):
    """preprocessing → tensorrt_llm → postprocessing, NVIDIA's `ensemble` model."""

    route = Route.ENSEMBLE
    model_name = "ensemble"
    single_sequence = (
        "the ensemble route returns one sequence per request: NVIDIA's ensemble does not "
        "pass sequence_index to postprocessing, so the texts of several would mix (serve "
        "with TRTLLM_ROUTE=direct or bls)"
    )

    def stop_words(self, stops: Sequence[str]) -> Sequence[str] | None:
        # The ensemble hands stop words to the engine only, so it gets the variants too.
        return engine_stop_words(stops)


class BlsRoute(TextRoute):
    """The `tensorrt_llm_bls` Python model, which also cuts its text at the stop words: that
    must happen at the stop strings as sent, so they go unchanged."""

    route = Route.BLS
    model_name = "tensorrt_llm_bls"
