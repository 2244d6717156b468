"""A response read from its raw bytes: every output's values, flattened, whatever Triton's
datatype (little-endian numbers, length-prefixed BYTES); and the readers built on it (token ids
of beam 0, sequence index, log probs, text)."""

from __future__ import annotations

import math

import numpy as np
from triton_results import result

from tensorrtllm_backend.serving.schemas import LOG_PROB_FLOOR
from tensorrtllm_backend.serving.translation import response_log_probs, sequence_index
from tensorrtllm_backend.serving.triton_paths.base import output_int
from tensorrtllm_backend.serving.triton_paths.direct import new_token_ids
from tensorrtllm_backend.serving.triton_paths.text import response_text


def test_values_of_every_datatype() -> None:
    got = result(
        ids=np.array([[[3, 4, 5]]], np.int32),
        one=np.array([[7]], np.int32),
        big=np.array([2**64 - 1], np.uint64),
        flag=np.array([True], np.bool_),
        probs=np.array([-0.5, -np.inf], np.float32),
        text=np.array([["héllo".encode()]], np.object_),
    )
    assert got.values("ids") == [3, 4, 5]
    assert got.values("one") == [7]
    assert got.values("big") == [2**64 - 1]
    assert got.values("flag") == [True]
    probs = got.values("probs")
    assert probs is not None and probs[0] == -0.5 and math.isinf(probs[1]) and probs[1] < 0
    assert got.values("text") == ["héllo"]
    assert got.values("missing") is None


def test_readers_read_every_route_s_outputs() -> None:
    # Beam search on the C++ backend: [1, beams, width] ids, one length per beam.
    beams = result(
        output_ids=np.array([[[8, 9, 0], [6, 7, 5]]], np.int32),
        sequence_length=np.array([[2, 3]], np.int32),
        sequence_index=np.array([[1]], np.int32),
        output_log_probs=np.array([[[-0.25, -np.inf]]], np.float32),
        kv_cache_reused_blocks=np.array([[4]], np.int32),
    )
    assert new_token_ids(beams) == [8, 9]
    assert sequence_index(beams) == 1
    assert response_log_probs(beams, 2) == [-0.25, LOG_PROB_FLOOR]
    assert output_int(beams, "kv_cache_reused_blocks") == 4
    assert output_int(beams, "cached_tokens") is None
    # The llmapi model: [n] ids, no sequence length.
    assert new_token_ids(result(output_ids=np.array([11, 12], np.int32))) == [11, 12]
    assert new_token_ids(result(output_ids=np.array([], np.int32))) == []
    text = result(text_output=np.array([[b" upon"]], np.object_))
    assert response_text(text) == " upon"
