"""The llmapi route: the tensors it sends (checked against the llmapi contract), what it refuses,
and how it decodes the model's responses (text so far + finish_reason)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import InferResult, service_pb2

from tensorrtllm_backend.serving.routes.llmapi import (
    OUTPUTS,
    LlmapiDecoder,
    LlmapiRequestError,
    check_request,
    tensors,
)
from tensorrtllm_backend.serving.schemas import FinishReason, GuidedDecoding, SamplingParams

CONTRACT = json.loads((Path(__file__).parents[2] / "data" / "contract_llmapi.json").read_text())
NUMPY_DTYPES = {
    "STRING": np.object_, "BOOL": np.bool_, "INT32": np.int32, "UINT64": np.uint64,
    "FP32": np.float32,
}  # fmt: skip


def test_tensors_follow_the_contract() -> None:
    params = SamplingParams(
        max_tokens=7, temperature=0.5, top_k=3, top_p=0.9, presence_penalty=0.1,
        frequency_penalty=0.2, seed=2**64 - 1, stop=["\n\n", "END"],
    )  # fmt: skip
    sent = tensors("Hello", params)
    inputs = {row["name"]: row for row in CONTRACT["inputs"]}
    for name, array in sent.items():
        row = inputs[name]  # every input is one NVIDIA's model declares
        assert array.dtype == NUMPY_DTYPES[row["dtype"]], name
        # max_batch_size 0: the shape is the dims, no batch dimension
        assert list(array.shape) == [len(params.stop) if row["dims"] == [-1] and
                                     name == "sampling_param_stop" else 1], name  # fmt: skip
    assert sent["text_input"].tolist() == [b"Hello"]
    assert sent["sampling_param_stop"].tolist() == [b"\n\n", b"END"]
    assert sent["sampling_param_max_tokens"].tolist() == [7]
    assert sent["sampling_param_seed"].tolist() == [2**64 - 1]
    assert sent["streaming"].tolist() == [True]
    assert sent["sampling_param_exclude_input_from_output"].tolist() == [True]
    assert sent["return_finish_reason"].tolist() == [True]
    assert set(OUTPUTS) <= {row["name"] for row in CONTRACT["outputs"]}


def test_unset_sampling_fields_are_not_sent() -> None:
    sent = tensors("Hi", SamplingParams(max_tokens=3))
    assert sorted(sent) == sorted(
        ["text_input", "streaming", "sampling_param_max_tokens",
         "sampling_param_exclude_input_from_output", "return_finish_reason"]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"min_tokens": 2}, "min_tokens"),
        ({"repetition_penalty": 1.1}, "repetition_penalty"),
        ({"length_penalty": 1.0}, "length_penalty"),
        ({"end_id": 2}, "end_id"),
        ({"pad_id": 0}, "pad_id"),
        ({"bad_words": ["x"]}, "bad_words"),
        ({"beam_width": 2}, "beam_width"),
        ({"num_return_sequences": 2}, "num_return_sequences"),
        ({"return_log_probs": True}, "return_log_probs"),
        ({"ignore_eos": True}, "ignore_eos"),
        ({"guided_decoding": GuidedDecoding(type="json")}, "guided_decoding"),
    ],
)
def test_what_the_workflow_cannot_do_is_refused(fields: dict, param: str) -> None:
    with pytest.raises(LlmapiRequestError, match=f"drop `{param}`") as caught:
        check_request(SamplingParams(**fields), None)
    assert caught.value.param == param


def test_packed_lora_is_refused_with_the_reason() -> None:
    with pytest.raises(LlmapiRequestError, match="lora_name/lora_path") as caught:
        check_request(SamplingParams(), "my-adapter")
    assert caught.value.param == "lora"


def test_plain_sampling_passes() -> None:
    check_request(SamplingParams(temperature=0.7, top_p=0.9, seed=1, stop=["x"]), None)


def response(text: str, finish_reason: str) -> InferResult:
    """A ModelInferResponse as tritonserver sends it for the llmapi model."""
    message = service_pb2.ModelInferResponse(model_name="tensorrt_llm")
    for name, value in (("text_output", text), ("finish_reason", finish_reason)):
        message.outputs.add(name=name, datatype="BYTES", shape=[1])
        # Triton's BYTES wire format: each element as a 4-byte little-endian length + its bytes.
        data = value.encode()
        message.raw_output_contents.append(struct.pack("<I", len(data)) + data)
    return InferResult(message)


def test_decoder_turns_text_so_far_into_deltas(demo_tokenizer) -> None:
    decoder = LlmapiDecoder(demo_tokenizer)
    steps = [("Once", "None"), ("Once upon", "None"), ("Once upon", "None"),
             ("Once upon a time", "length")]  # fmt: skip
    out = [decoder(response(text, reason)) for text, reason in steps]
    assert [text for text, *_ in out] == ["Once", " upon", "", " a time"]
    assert [count for _, _, count, _ in out] == [1, 1, 0, 2]  # a step without text counts later
    assert decoder.finish_reason is FinishReason.LENGTH
    assert decoder.counted + decoder.settle(max_tokens=5) == 5  # ended for length: max_tokens


def test_decoder_counts_a_stopped_completion_with_the_tokenizer(demo_tokenizer) -> None:
    decoder = LlmapiDecoder(demo_tokenizer)
    decoder(response("Once upon", "None"))
    decoder(response("Once upon a time", "stop"))
    assert decoder.finish_reason is FinishReason.STOP
    expected = len(demo_tokenizer.encode("Once upon a time", add_special_tokens=False))
    assert decoder.counted + decoder.settle(max_tokens=100) == expected
    assert decoder.counted + decoder.settle(max_tokens=2) == 2  # never above max_tokens


def test_revised_text_sends_nothing_more(demo_tokenizer) -> None:
    decoder = LlmapiDecoder(demo_tokenizer)
    assert decoder(response("Once upon a ti", "None"))[0] == "Once upon a ti"
    assert decoder(response("Once upon a", "stop"))[0] == ""  # stop word trimmed at the end
    assert decoder.finish_reason is FinishReason.STOP
