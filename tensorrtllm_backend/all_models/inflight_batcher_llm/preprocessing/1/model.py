"""Preprocessing: prompt text and word lists in, the tensorrt_llm model's token tensors out.

Follows NVIDIA's newer preprocessing (c2e65b8) tensor for tensor. Differences on purpose: an
empty prompt is a per-request error (TensorRT-LLM rejects 0-length input), multimodal inputs are
rejected with a clear error, and the decoder / prompt-table outputs are only produced when their
inputs are given (an ensemble step output that is not produced simply leaves the optional
downstream input unset; checked with tritonserver 2.51).
"""

import json
import os
import sys

# Triton's python stub ignores PYTHONPATH: the supervisor passes our paths (venv, package) here.
sys.path[:0] = filter(None, os.environ.get("TRTLLM_BACKEND_PYTHONPATH", "").split(os.pathsep))

import numpy as np
import triton_python_backend_utils as pb_utils

from tensorrtllm_backend.common.tokenization import build_embedding_bias, encode_word_lists
from tensorrtllm_backend.python_models.bls.params import (
    engine_vocab_size,
    model_parameter,
    model_tokenizer,
    parse_bool,
    resolve_model_path,
)
from tensorrtllm_backend.python_models.request_error import RequestError
from tensorrtllm_backend.python_models.stub_guard import start_orphan_guard

_UNSUPPORTED_INPUTS = ("IMAGE_BYTES", "IMAGE_URL", "VIDEO_BYTES")


def _optional(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class TritonPythonModel:
    """Tokenizes each request on its own; a bad request never fails its batch neighbours."""

    def initialize(self, args: dict[str, str]) -> None:
        self._orphan_guard = start_orphan_guard()  # exits with the stub
        config = json.loads(args["model_config"])
        repository = args["model_repository"]
        self.tokenizer = model_tokenizer(config, repository, "preprocessing")
        self.add_special_tokens = parse_bool(
            model_parameter(config, "add_special_tokens"), True, "add_special_tokens"
        )
        engine_dir = model_parameter(config, "gpt_model_path")
        engine_path = resolve_model_path(engine_dir, repository) if engine_dir else None
        # Bias and prompt-table ids must match the engine's logits width, not the tokenizer's.
        self.vocab_size = engine_vocab_size(engine_path) or len(self.tokenizer)
        self.end_id = int(self.tokenizer.eos_token_id)
        self.pad_id = int(self.tokenizer.pad_token_id)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                tensors = self._preprocess(request)
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except RequestError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
            except Exception as exc:  # never let one request take the model down
                message = f"preprocessing failed: {type(exc).__name__}: {exc}"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
        return responses

    def _tokenize(self, queries: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
        """Rows of [batch, 1] strings -> right-padded ids [batch, len] and lengths [batch, 1]."""
        rows = []
        for row in queries.reshape(queries.shape[0], -1):
            text = "".join(_text(item) for item in row)
            if not text:
                raise RequestError(f"{what} is empty")
            ids = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)
            if not ids:
                raise RequestError(f"{what} encodes to no tokens")
            rows.append(ids)
        width = max(len(ids) for ids in rows)
        input_ids = np.full((len(rows), width), self.pad_id, dtype=np.int32)
        for index, ids in enumerate(rows):
            input_ids[index, : len(ids)] = ids
        lengths = np.array([[len(ids)] for ids in rows], dtype=np.int32)
        return input_ids, lengths

    def _per_row_ids(self, value: np.ndarray | None, default: int, batch: int, name: str):
        if value is None:
            return np.full((batch, 1), default, dtype=np.int32)
        value = np.asarray(value, dtype=np.int32).reshape(-1, 1)
        if value.shape[0] != batch:
            raise RequestError(f"{name} has {value.shape[0]} rows, the prompt has {batch}")
        return value

    def _embedding_bias(self, request, batch: int) -> np.ndarray:
        words = _optional(request, "EMBEDDING_BIAS_WORDS")
        weights = _optional(request, "EMBEDDING_BIAS_WEIGHTS")
        if words is None and weights is None:
            return np.zeros((batch, 0), dtype=np.float32)
        if words is None or weights is None:
            raise RequestError("embedding_bias_words and embedding_bias_weights go together")
        words = words.reshape(batch, -1)
        weights = weights.reshape(batch, -1)
        try:
            return np.stack(
                [
                    build_embedding_bias(self.tokenizer, list(w), list(v), self.vocab_size)
                    for w, v in zip(words, weights, strict=True)
                ]
            )
        except ValueError as exc:
            raise RequestError(str(exc)) from exc

    def _preprocess(self, request) -> list:
        for name in _UNSUPPORTED_INPUTS:
            if pb_utils.get_input_tensor_by_name(request, name) is not None:
                raise RequestError(f"{name}: multimodal input is not supported by this model")
        query = _optional(request, "QUERY")
        if query is None:
            raise RequestError("QUERY (text_input) is required")
        batch = query.shape[0]
        input_ids, input_lengths = self._tokenize(query, "prompt")
        output_len = _optional(request, "REQUEST_OUTPUT_LEN")
        if output_len is None:
            raise RequestError("REQUEST_OUTPUT_LEN (max_tokens) is required")

        def word_lists(name: str) -> np.ndarray:
            words = _optional(request, name)
            rows = [[] for _ in range(batch)] if words is None else words.reshape(batch, -1)
            return encode_word_lists(self.tokenizer, rows)

        tensors = [
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", input_lengths),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.asarray(output_len, dtype=np.int32)),
            pb_utils.Tensor("BAD_WORDS_IDS", word_lists("BAD_WORDS_DICT")),
            pb_utils.Tensor("STOP_WORDS_IDS", word_lists("STOP_WORDS_DICT")),
            pb_utils.Tensor("EMBEDDING_BIAS", self._embedding_bias(request, batch)),
            pb_utils.Tensor(
                "OUT_END_ID",
                self._per_row_ids(_optional(request, "END_ID"), self.end_id, batch, "end_id"),
            ),
            pb_utils.Tensor(
                "OUT_PAD_ID",
                self._per_row_ids(_optional(request, "PAD_ID"), self.pad_id, batch, "pad_id"),
            ),
        ]
        decoder_query = _optional(request, "DECODER_QUERY")
        if decoder_query is not None:
            decoder_ids, decoder_lengths = self._tokenize(decoder_query, "decoder prompt")
            tensors.append(pb_utils.Tensor("DECODER_INPUT_ID", decoder_ids))
            tensors.append(pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", decoder_lengths))
        extra_id = _optional(request, "PROMPT_TABLE_EXTRA_ID")
        if extra_id is not None:
            extra = np.asarray(extra_id, dtype=np.uint64).reshape(-1, 1)
            if extra.shape[0] != batch:
                raise RequestError("prompt_table_extra_id needs one value per prompt")
            # Only prompt-table tokens (ids beyond the vocabulary) carry the extra id.
            per_token = np.where(input_ids >= self.vocab_size, extra, 0).astype(np.uint64)
            tensors.append(pb_utils.Tensor("OUT_PROMPT_TABLE_EXTRA_IDS", per_token))
        return tensors
