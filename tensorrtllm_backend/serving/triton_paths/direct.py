"""The `direct` route: the service tokenizes and calls the `tensorrt_llm` model with token ids.

Stop and bad words go as token-id lists, the end and pad ids from the tokenizer unless the
request sets them; each streamed response carries the new token ids, detokenized here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...common.engine_api import EngineResult
from ...common.tokenization import IncrementalDetokenizer, encode_word_lists
from ..request_errors import RequestError
from ..schemas import SamplingParams
from ..translation import (
    NO_END_ID,
    LoraTensors,
    engine_stop_words,
    optional_outputs,
    response_log_probs,
    response_top_log_probs,
    sampling_tensors,
    scalar,
)
from .base import (
    Decoded,
    EngineRoute,
    Route,
    RouteRequest,
    StepDecoder,
    image_tensor,
    output_int,
)

REUSED_BLOCKS = "kv_cache_reused_blocks"


@dataclass(frozen=True, slots=True)
class TokenIds:
    """What the engine-side request needs beyond the sampling parameters."""

    prompt_ids: Sequence[int]
    end_id: int
    pad_id: int
    stop_words_ids: np.ndarray | None = None  # [1, 2, L] contract layout
    bad_words_ids: np.ndarray | None = None


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
        "input_lengths": scalar(len(ids.prompt_ids), np.int32),
        "request_output_len": scalar(params.max_tokens, np.int32),
        "end_id": scalar(NO_END_ID if params.ignore_eos else ids.end_id, np.int32),
        "pad_id": scalar(ids.pad_id, np.int32),
        "streaming": scalar(True, np.bool_),
        "exclude_input_in_output": scalar(True, np.bool_),
        **sampling_tensors(params, _DIRECT_NAMES),
    }
    if ids.stop_words_ids is not None and ids.stop_words_ids.shape[-1] > 0:
        tensors["stop_words_list"] = ids.stop_words_ids
    if ids.bad_words_ids is not None and ids.bad_words_ids.shape[-1] > 0:
        tensors["bad_words_list"] = ids.bad_words_ids
    if lora is not None:
        tensors.update(lora.tensors())
    return tensors


def direct_outputs(params: SamplingParams) -> list[str]:
    return ["output_ids", "sequence_length", *optional_outputs(params)]


def new_token_ids(result: EngineResult) -> list[int]:
    """Tokens of beam 0 in one streamed response: `output_ids` ([batch, beam, n] from
    ``tensorrt_llm``, [n] from the llmapi model), cut to beam 0's `sequence_length` where it is
    sent. Outputs arrive flattened; `sequence_length` has one value per beam, so beam 0's ids
    are the first n = len(ids) / beams."""
    ids = result.values("output_ids")
    if not ids:
        return []
    lengths = result.values("sequence_length")
    if not lengths:
        return ids
    width = len(ids) // len(lengths)
    return ids[: min(int(lengths[0]), width)]


class DirectDecoder(StepDecoder):
    """Token-id responses → (final text, token ids, token count, log probs, alternatives), for
    `tensorrt_llm` and the llmapi model alike."""

    def __init__(self, tokenizer: Any, want_log_probs: bool, top_log_probs: int = 0) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._want_log_probs = want_log_probs
        self._top = top_log_probs

    def __call__(self, result: EngineResult) -> Decoded:
        ids = new_token_ids(result)
        count = len(ids)
        log_probs = response_log_probs(result, count) if self._want_log_probs else None
        top = response_top_log_probs(result, count, self._top) if self._top else None
        return self._detokenizer.feed(ids), ids, count, log_probs, top

    def flush(self) -> str:
        return self._detokenizer.flush()


class DirectRoute(EngineRoute):
    """Token ids in and out of the `tensorrt_llm` model."""

    route = Route.DIRECT
    model_name = "tensorrt_llm"
    no_images = None  # whether the engine takes them is the model's (the runtime checks)

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self._eos_id: int | None = tokenizer.eos_token_id
        self._pad_id: int | None = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self._eos_id
        )

    def check_prepared(self, params: SamplingParams) -> None:
        if params.end_id is None and self._eos_id is None:
            raise RequestError("the tokenizer has no end token: pass end_id", param="end_id")

    def inputs(
        self, request: RouteRequest, lora: LoraTensors | None
    ) -> tuple[dict[str, np.ndarray], list[str]]:
        params = request.params
        tensors = direct_tensors(params, self.token_ids(request), lora)
        tensors.update(image_tensor(request, batched=True))
        outputs = direct_outputs(params)
        if self.tokens_per_block:
            # The C++ backend reports the KV-cache blocks a request reused with its perf metrics.
            tensors["return_perf_metrics"] = scalar(True, np.bool_)
            outputs.append(REUSED_BLOCKS)
        return tensors, outputs

    def cached_tokens(self, last: EngineResult) -> int:
        """The C++ backend's reused KV-cache blocks x the engine's block size."""
        blocks = output_int(last, REUSED_BLOCKS)
        return blocks * self.tokens_per_block if blocks and self.tokens_per_block else 0

    def token_ids(self, request: RouteRequest) -> TokenIds:
        params = request.params
        end_id = params.end_id if params.end_id is not None else self._eos_id
        pad_id = params.pad_id if params.pad_id is not None else self._pad_id
        assert end_id is not None  # checked in check_prepared()
        return TokenIds(
            prompt_ids=request.prompt_ids,
            end_id=end_id,
            pad_id=pad_id if pad_id is not None else end_id,
            stop_words_ids=encode_word_lists(self.tokenizer, [engine_stop_words(params.stop)])
            if params.stop
            else None,
            bad_words_ids=(
                encode_word_lists(self.tokenizer, [params.bad_words]) if params.bad_words else None
            ),
        )

    def decoder(self, params: SamplingParams) -> DirectDecoder:
        return DirectDecoder(self.tokenizer, params.return_log_probs, params.top_log_probs)
