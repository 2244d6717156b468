"""Postprocessing: TOKENS_BATCH [batch, beam, len] + SEQUENCE_LENGTH [batch, beam] -> OUTPUT text.

Streaming through the ensemble sends one call per response holding only the new tokens. NVIDIA
decodes each call in isolation and loses multi-byte characters and spaces at chunk borders.
Here, when the request carries a request id (Triton forwards the client's id to every ensemble
step), beam-1 rows keep an IncrementalDetokenizer per (request id, row) in a bounded cache, so
the concatenated stream equals the non-streamed text. Without a request id the call is decoded
alone (NVIDIA's behaviour). In both cases a trailing incomplete character is not emitted: the
model cannot tell the last call of a stream from the others, so it never emits a partial char.
Exact streaming needs: unique request ids per request and one postprocessing instance (the
state lives in the instance's process).
"""

import json
import os
import sys

# Triton's python stub ignores PYTHONPATH: the supervisor passes our paths (venv, package) here.
sys.path[:0] = filter(None, os.environ.get("TRTLLM_BACKEND_PYTHONPATH", "").split(os.pathsep))

import numpy as np
import triton_python_backend_utils as pb_utils

from tensorrtllm_backend.common.tokenization import IncrementalDetokenizer
from tensorrtllm_backend.python_models.bls.detok_cache import DetokenizerCache
from tensorrtllm_backend.python_models.bls.params import (
    model_parameter,
    model_tokenizer,
    parse_bool,
)
from tensorrtllm_backend.python_models.stub_guard import start_orphan_guard


class TritonPythonModel:
    """Decodes every request of a batch; errors stay per request."""

    def initialize(self, args: dict[str, str]) -> None:
        self._orphan_guard = start_orphan_guard()  # exits with the stub
        config = json.loads(args["model_config"])
        self.tokenizer = model_tokenizer(config, args["model_repository"], "postprocessing")
        self.skip_special_tokens = parse_bool(
            model_parameter(config, "skip_special_tokens"), True, "skip_special_tokens"
        )
        max_entries = model_parameter(config, "stream_state_max_entries")
        idle_seconds = model_parameter(config, "stream_state_idle_seconds")
        self.streams = DetokenizerCache(
            self._new_detokenizer,
            max_entries=int(max_entries) if max_entries else 4096,
            idle_seconds=float(idle_seconds) if idle_seconds else 120.0,
        )

    def _new_detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, self.skip_special_tokens)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                output = self._decode(request)
                responses.append(
                    pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", output)])
                )
            except Exception as exc:  # one bad request must not fail the whole batch
                message = f"postprocessing failed: {type(exc).__name__}: {exc}"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
        return responses

    def _decode(self, request) -> np.ndarray:
        tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
        if tokens.ndim == 2:  # [batch, len]: a single beam
            tokens = tokens[:, None, :]
        lengths = lengths.reshape(tokens.shape[0], tokens.shape[1])
        request_id = request.request_id()
        # Beams of beam search are rewritten between responses: only beam 1 streams stateful.
        stateful = bool(request_id) and tokens.shape[1] == 1
        output = np.empty(tokens.shape[:2], dtype=object)
        for row in range(tokens.shape[0]):
            for beam in range(tokens.shape[1]):
                ids = tokens[row, beam, : max(0, int(lengths[row, beam]))].tolist()
                if stateful:
                    detokenizer = self.streams.get((request_id, row))
                else:
                    detokenizer = self._new_detokenizer()
                output[row, beam] = detokenizer.feed(ids).encode("utf-8")
        return output
