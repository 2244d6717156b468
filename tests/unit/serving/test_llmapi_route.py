"""The llmapi route: the token-id tensors it sends (checked against our llmapi model's
config.pbtxt) and the responses it reads (the direct route's decoder, on the llmapi model's
one-dimensional outputs)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from triton_results import result

from tensorrtllm_backend.common.model_repository import parse_config
from tensorrtllm_backend.packing.llmapi_repository import MODEL_NAME, TEMPLATES_DIR
from tensorrtllm_backend.serving.schemas import LOG_PROB_FLOOR, GuidedDecoding, SamplingParams
from tensorrtllm_backend.serving.translation import LoraTensors
from tensorrtllm_backend.serving.triton_paths.direct import DirectDecoder
from tensorrtllm_backend.serving.triton_paths.llmapi import llmapi_tensors

CONFIG = parse_config((TEMPLATES_DIR / MODEL_NAME / "config.pbtxt").read_text())
INPUTS = {tensor.name: tensor for tensor in CONFIG.input}
NUMPY_DTYPES = {
    "TYPE_STRING": np.object_, "TYPE_BOOL": np.bool_, "TYPE_INT32": np.int32,
    "TYPE_UINT64": np.uint64, "TYPE_FP32": np.float32,
}  # fmt: skip


def _dtype(name: str) -> type:
    from tritonclient.grpc import model_config_pb2

    return NUMPY_DTYPES[model_config_pb2.DataType.Name(INPUTS[name].data_type)]


def test_every_tensor_is_an_input_of_the_model_with_its_dtype_and_rank() -> None:
    params = SamplingParams(
        max_tokens=7, min_tokens=2, temperature=0.5, top_k=3, top_p=0.9, repetition_penalty=1.1,
        presence_penalty=0.1, frequency_penalty=0.2, length_penalty=1.0, seed=2**64 - 1,
        stop=["\n\n", "END"], bad_words=["x"], end_id=2, pad_id=0, num_return_sequences=2,
        return_log_probs=True, top_log_probs=3, ignore_eos=True,
        guided_decoding=GuidedDecoding(type="json_schema", guide='{"type": "object"}'),
    )  # fmt: skip
    lora = LoraTensors(17, name="adapter", path="/models/x/loras/adapter")
    sent = llmapi_tensors(params, [1, 5, 9], lora)
    for name, array in sent.items():
        assert array.dtype == _dtype(name), name
        assert array.ndim == len(INPUTS[name].dims) == 1, name  # max_batch_size 0: no batch dim
    assert sent["text_input"].tolist() == [b""]
    assert sent["input_ids"].tolist() == [1, 5, 9]
    assert sent["sampling_param_n"].tolist() == [2]
    assert sent["sampling_param_logprobs"].tolist() == [3]
    assert sent["sampling_param_seed"].tolist() == [2**64 - 1]
    assert sent["sampling_param_stop"].tolist() == [b"\n\n", b"END", b" END"]
    assert sent["sampling_param_bad"].tolist() == [b"x"]
    assert sent["guided_decoding_guide_type"].tolist() == [b"json_schema"]
    assert (sent["lora_id"].tolist(), sent["lora_name"].tolist()) == ([17], [b"adapter"])


def test_unset_fields_are_not_sent() -> None:
    sent = llmapi_tensors(SamplingParams(max_tokens=3), [4])
    assert sorted(sent) == sorted(
        ["text_input", "input_ids", "streaming", "sampling_param_max_tokens",
         "sampling_param_exclude_input_from_output"]
    )  # fmt: skip
    assert llmapi_tensors(SamplingParams(return_log_probs=True), [4])[
        "sampling_param_logprobs"
    ].tolist() == [0]


def test_the_direct_decoder_reads_the_llmapi_outputs(demo_tokenizer) -> None:
    ids = demo_tokenizer.encode(" upon a time", add_special_tokens=False)
    decoder = DirectDecoder(demo_tokenizer, want_log_probs=True, top_log_probs=2)
    pieces = []
    for position, token in enumerate(ids):
        top_ids = np.array([[token, 7]], np.int32)
        top_values = np.array([[-0.1, -np.inf]], np.float32)
        text, got, count, log_probs, top = decoder(
            result(
                output_ids=np.array([token], np.int32),
                sequence_index=np.array([0], np.int32),
                output_log_probs=np.array([-0.1 * position], np.float32),
                output_top_token_ids=top_ids,
                output_top_log_probs=top_values,
            )
        )
        pieces.append(text)
        assert (got, count) == ([token], 1)
        assert log_probs == pytest.approx([-0.1 * position])
        assert top == [([token, 7], [pytest.approx(-0.1), LOG_PROB_FLOOR])]
    assert "".join(pieces) + decoder.flush() == " upon a time"


def test_fewer_alternatives_than_asked_for_is_an_error(demo_tokenizer) -> None:
    from tensorrtllm_backend.common.engine_api import EngineModelError

    decoder = DirectDecoder(demo_tokenizer, want_log_probs=True, top_log_probs=3)
    with pytest.raises(EngineModelError, match="3 alternatives"):
        decoder(
            result(
                output_ids=np.array([5], np.int32),
                output_log_probs=np.array([-0.5], np.float32),
                output_top_token_ids=np.array([[5, 6]], np.int32),
                output_top_log_probs=np.array([[-0.5, -1.0]], np.float32),
            )
        )


def test_struct_layout_is_little_endian() -> None:
    """new_token_ids reads raw bytes as little-endian int32, as Triton sends them."""
    assert struct.pack("<i", 5) == np.array([5], np.int32).astype("<i4").tobytes()


def test_the_route_asks_for_the_models_cached_tokens(demo_tokenizer) -> None:
    from tensorrtllm_backend.serving.triton_paths.llmapi import LlmapiRoute

    class Request:
        prompt = "Hi"
        params = SamplingParams(return_log_probs=True, top_log_probs=2)
        prompt_ids = [1, 2]
        images = ()
        written_ids = None

    tensors, outputs = LlmapiRoute(demo_tokenizer).inputs(Request(), None)
    assert outputs == [
        "output_ids", "output_log_probs", "output_top_token_ids", "output_top_log_probs",
        "cached_tokens",
    ]  # fmt: skip
    assert "return_perf_metrics" not in tensors
