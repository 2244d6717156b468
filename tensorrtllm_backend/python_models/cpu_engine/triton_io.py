"""Triton tensors of a tensorrt_llm request -> GenRequest keyword arguments, one set per sequence.

A request may carry several rows (batch dim B > 1, e.g. the ensemble fed a batch of prompts),
and each row may ask for num_return_sequences = N sequences (beam width 1, TensorRT-LLM's
semantics): row b becomes N GenRequests with batch_index = b and sequence_index = 0..N-1, and
their responses carry both indexes. Per-request scalars arrive as [B, 1] (or [B] with reshape
[]); a single value is broadcast. pb_utils only exists inside the Triton python stub, so it is
passed in rather than imported.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..request_error import RequestError
from .request import SamplingParams, parse_word_list

MAX_TOP_LOG_PROBS = 20  # alternatives per token (OpenAI's top_logprobs limit)
# return_context_logits: prompt tokens x vocabulary values per request (1 GiB of float32);
# a larger matrix is refused rather than allocated.
MAX_CONTEXT_LOGITS = 1 << 28


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    # GenRequest keyword arguments (without sink), one per sequence: rows x num_return_sequences,
    # row-major (row 0's sequences first).
    sequences: list[dict[str, Any]]
    streaming: bool
    perf_metrics: bool  # return_perf_metrics: add the *_time_ns outputs to final responses
    max_return_sequences: int = 1  # the largest num_return_sequences of any row


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_input_len: int
    max_seq_len: int
    max_beam_width: int
    vocab_size: int
    default_end_id: int | None
    exclude_input_in_output: bool
    max_batch_size: int  # each returned sequence takes a batch slot: caps num_return_sequences


class _Inputs:
    """Reads a request's optional inputs and spreads per-request values over its rows."""

    def __init__(self, pb: Any, request: Any, batch: int) -> None:
        self._pb = pb
        self._request = request
        self.batch = batch

    def array(self, name: str) -> np.ndarray | None:
        tensor = self._pb.get_input_tensor_by_name(self._request, name)
        return None if tensor is None else tensor.as_numpy()

    def rows(self, name: str, default: Any) -> list[Any]:
        """One value per row: absent -> default, one value -> broadcast, else [B, 1] or [B]."""
        value = self.array(name)
        if value is None or value.size == 0:
            return [default] * self.batch
        if value.size == 1:
            return [value.reshape(-1)[0].item()] * self.batch
        if value.size != self.batch:
            raise RequestError(
                f"input '{name}' must hold one value per sequence ({self.batch}), "
                f"got shape {value.shape}"
            )
        return value.reshape(-1).tolist()

    def strings(self, name: str) -> list[str | None]:
        """One UTF-8 string per row (TYPE_STRING [B, 1]); None where absent or empty."""
        array = self.array(name)
        if array is None or array.size == 0:
            return [None] * self.batch
        values = array.reshape(-1).tolist()
        if len(values) == 1:
            values *= self.batch
        elif len(values) != self.batch:
            raise RequestError(
                f"input '{name}' must hold one value per sequence ({self.batch}), "
                f"got shape {array.shape}"
            )
        texts: list[str | None] = []
        for value in values:
            if isinstance(value, bytes):
                try:
                    value = value.decode("utf-8")
                except UnicodeDecodeError:
                    raise RequestError(f"input '{name}' is not UTF-8 text") from None
            texts.append(value or None)
        return texts

    def images(self) -> list[list[bytes]]:
        """Each row's images (`images`: [batch, n] encoded bytes; a ragged batch's shorter rows
        end in empty entries, which are not images)."""
        value = self.array("images")
        if value is None or value.size == 0:
            return [[] for _ in range(self.batch)]
        if value.ndim == 1:
            value = value[None]
        if value.ndim != 2 or value.shape[0] not in (1, self.batch):
            raise RequestError(f"input 'images' must have shape [batch, n], got {value.shape}")
        rows = [[bytes(item) for item in row if len(item)] for row in value]
        return rows * self.batch if len(rows) == 1 and self.batch > 1 else rows

    def word_lists(self, name: str) -> list[list[list[int]]]:
        value = self.array(name)
        if value is None or value.size == 0:
            return [[] for _ in range(self.batch)]
        if value.ndim == 2:
            value = value[None]
        if value.ndim != 3 or value.shape[1] != 2 or value.shape[0] not in (1, self.batch):
            raise RequestError(f"input '{name}' must have shape [batch, 2, L], got {value.shape}")
        try:
            lists = [parse_word_list(row[0].tolist(), row[1].tolist()) for row in value]
        except ValueError as exc:
            raise RequestError(f"input '{name}': {exc}") from exc
        return lists * self.batch if len(lists) == 1 else lists


def parse_request(pb: Any, request: Any, limits: EngineLimits) -> ParsedRequest:
    """Validate one tensorrt_llm request (all rows, or RequestError for the whole request)."""
    get = pb.get_input_tensor_by_name
    ids_tensor = get(request, "input_ids")
    if ids_tensor is None:
        raise RequestError("input 'input_ids' is required by the CPU engine")
    input_ids = ids_tensor.as_numpy()
    if input_ids.ndim == 1:
        input_ids = input_ids[None]
    if input_ids.ndim != 2 or input_ids.shape[0] < 1:
        raise RequestError(f"input_ids must have shape [batch, len], got {input_ids.shape}")
    inputs = _Inputs(pb, request, input_ids.shape[0])
    lengths = inputs.rows("input_lengths", input_ids.shape[1])
    output_lens = inputs.rows("request_output_len", None)
    if output_lens[0] is None:
        raise RequestError("input 'request_output_len' is required")
    for value in inputs.rows("beam_width", 1):
        if int(value) > limits.max_beam_width:
            raise RequestError(
                f"beam_width {int(value)} exceeds the engine's limit {limits.max_beam_width}"
            )
        if int(value) != 1:  # so num_return_sequences > 1 always means N sampled sequences
            raise RequestError("the CPU engine supports beam_width 1 only")
    return_sequences = [int(v) for v in inputs.rows("num_return_sequences", 1)]
    for count in return_sequences:
        if count < 1:
            raise RequestError(f"num_return_sequences must be at least 1, got {count}")
        if count > limits.max_batch_size:
            raise RequestError(
                f"num_return_sequences {count} exceeds the engine's max_batch_size "
                f"{limits.max_batch_size} (each returned sequence takes a batch slot): ask for "
                f"at most {limits.max_batch_size}"
            )

    end_ids = inputs.rows("end_id", limits.default_end_id)
    pad_ids = inputs.rows("pad_id", None)
    min_tokens = inputs.rows("min_tokens", None)
    if min_tokens[0] is None:
        min_tokens = inputs.rows("min_length", 0)  # v0.8 / v0.19 name
    seeds = inputs.rows("seed", None)
    if seeds[0] is None:
        seeds = inputs.rows("random_seed", 0)  # v0.8 / v0.19 name
    temperature = inputs.rows("temperature", 1.0)
    top_k = inputs.rows("runtime_top_k", 0)
    top_p = inputs.rows("runtime_top_p", 0.0)
    repetition = inputs.rows("repetition_penalty", 1.0)
    presence = inputs.rows("presence_penalty", 0.0)
    frequency = inputs.rows("frequency_penalty", 0.0)
    stop_words = inputs.word_lists("stop_words_list")
    bad_words = inputs.word_lists("bad_words_list")
    # Response-shaping flags are per request (one response stream): row 0 decides.
    streaming = bool(inputs.rows("streaming", False)[0])
    exclude = bool(inputs.rows("exclude_input_in_output", limits.exclude_input_in_output)[0])
    log_probs = bool(inputs.rows("return_log_probs", False)[0])
    top = int(inputs.rows("top_log_probs", 0)[0])
    if not 0 <= top <= MAX_TOP_LOG_PROBS:
        raise RequestError(f"top_log_probs must be 0 to {MAX_TOP_LOG_PROBS}, got {top}")
    perf = bool(inputs.rows("return_perf_metrics", False)[0])
    context_logits = bool(inputs.rows("return_context_logits", False)[0])
    guide_types = inputs.strings("guided_decoding_guide_type")
    guides = inputs.strings("guided_decoding_guide")
    images = inputs.images()
    bias = inputs.array("embedding_bias")
    if bias is not None and bias.size:
        bias = bias.reshape(bias.shape[0], -1) if bias.ndim > 1 else bias.reshape(1, -1)
    request_id = request.request_id()

    sequences: list[dict[str, Any]] = []
    for row in range(inputs.batch):
        input_len, output_len = int(lengths[row]), int(output_lens[row])
        if not 0 < input_len <= input_ids.shape[1]:
            raise RequestError(
                f"input_lengths {input_len} does not fit input_ids of length {input_ids.shape[1]}"
            )
        if input_len > limits.max_input_len:
            raise RequestError(
                f"prompt length {input_len} exceeds the engine's max_input_len "
                f"{limits.max_input_len}"
            )
        prompt = input_ids[row, :input_len].astype(np.int64)
        if int(prompt.min()) < 0 or int(prompt.max()) >= limits.vocab_size:
            raise RequestError(
                f"input_ids hold token ids outside the vocabulary [0, {limits.vocab_size})"
            )
        if output_len <= 0:
            raise RequestError(f"request_output_len must be positive, got {output_len}")
        if input_len + output_len > limits.max_seq_len:
            raise RequestError(
                f"prompt length {input_len} + request_output_len {output_len} exceeds the "
                f"engine's max_seq_len {limits.max_seq_len}"
            )
        if context_logits and input_len * limits.vocab_size > MAX_CONTEXT_LOGITS:
            raise RequestError(
                f"return_context_logits for a {input_len}-token prompt would return "
                f"{input_len} x {limits.vocab_size} logits, more than the CPU engine's "
                f"{MAX_CONTEXT_LOGITS}: send a shorter prompt"
            )
        row_bias = None
        if bias is not None and bias.size:
            row_bias = bias[row if bias.shape[0] > 1 else 0].tolist()
        sequences += split_sequences(
            {
                "prompt": prompt.tolist(),
                "max_new_tokens": output_len,
                "request_id": request_id,
                "batch_index": row,
                "sequence_index": 0,
                "end_id": None if end_ids[row] is None else int(end_ids[row]),
                "pad_id": None if pad_ids[row] is None else int(pad_ids[row]),
                "stop_words": stop_words[row],
                "bad_words": bad_words[row],
                "min_tokens": int(min_tokens[row]),
                "streaming": streaming,
                "exclude_input_in_output": exclude,
                "return_log_probs": log_probs,
                "top_logprobs": top,
                "context_logits": context_logits,
                "sampling": SamplingParams(
                    temperature=float(temperature[row]),
                    top_k=int(top_k[row]),
                    top_p=float(top_p[row]),
                    repetition_penalty=float(repetition[row]),
                    presence_penalty=float(presence[row]),
                    frequency_penalty=float(frequency[row]),
                    seed=int(seeds[row]),
                ),
                "embedding_bias": row_bias,
                "guided": guide_of(guide_types[row], guides[row]),
                "images": images[row],
            },
            return_sequences[row],
        )
    return ParsedRequest(
        sequences=sequences,
        streaming=streaming,
        perf_metrics=perf,
        max_return_sequences=max(return_sequences),
    )


GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")


def guide_of(guide_type: str | None, guide: str | None) -> tuple[str, str | None] | None:
    """The C++ backend's guide tensors as (type, guide), None without a guide; RequestError
    for a guide without a type, an unknown type, or a type that needs a guide and has none."""
    if guide_type is None:
        if guide is not None:
            raise RequestError("input 'guided_decoding_guide' needs 'guided_decoding_guide_type'")
        return None
    if guide_type not in GUIDE_TYPES:
        raise RequestError(
            f"guided_decoding_guide_type {guide_type!r} is not one of {', '.join(GUIDE_TYPES)}"
        )
    if guide is None and guide_type != "json":
        raise RequestError(f"guided_decoding_guide_type {guide_type!r} needs guided_decoding_guide")
    return guide_type, guide


def split_sequences(row: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """One row's GenRequest arguments (sequence_index 0) -> `count` sequences for
    num_return_sequences = count (beam width 1), as TensorRT-LLM splits such a request into
    child requests.

    Sequence i samples with seed + i, so that N sampled sequences differ yet stay reproducible
    (the same request gives the same N sequences); greedy sequences ignore the seed and are
    identical, as on TensorRT-LLM. (The synthetic backend derives every token from the seed, so
    its sequences differ even with greedy settings.) The prompt and word lists are shared, not
    copied: the engine only reads them.
    """
    if count == 1:
        return [row]
    sampling: SamplingParams = row["sampling"]
    sequences = [row]
    for i in range(1, count):
        sequences.append(
            {
                **row,
                "sequence_index": i,
                "sampling": replace(sampling, seed=(sampling.seed + i) % 2**64),  # UINT64 input
            }
        )
    return sequences
