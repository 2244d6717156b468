"""The HTTP generate_stream transport: which requests it carries (the rest go by gRPC), the JSON it
sends, how server-sent events are cut from the bytes as they arrive, and how Triton's HTTP errors
map to the same answers as the same failures over gRPC. The transport against a real
tritonserver: tests/integration/test_cpu_engine_triton.py (the service client's tests)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tensorrtllm_backend.common.engine_api import (
    EngineInstanceDeadError,
    EngineModelError,
    EngineRequestError,
    EngineTimeoutError,
    EngineUnavailableError,
)
from tensorrtllm_backend.serving.errors import answer_for
from tensorrtllm_backend.serving.routes.direct import TokenIds, direct_tensors
from tensorrtllm_backend.serving.routes.llmapi import llmapi_tensors
from tensorrtllm_backend.serving.schemas import GuidedDecoding, SamplingParams
from tensorrtllm_backend.serving.translation import LoraTensors
from tensorrtllm_backend.triton.client import TritonLLMClient
from tensorrtllm_backend.triton.http_stream import (
    MAX_JSON_VALUES,
    GenerateError,
    _error_message,
    generate_body,
    split_events,
)

PARAMS = SamplingParams(max_tokens=8, temperature=0.5, seed=2**64 - 1, stop=["END"])


def test_the_llmapi_models_tensors_go_as_json_with_their_values() -> None:
    guided = PARAMS.model_copy(
        update={"guided_decoding": GuidedDecoding(type="json_schema", guide='{"type":"object"}')}
    )
    body = generate_body(llmapi_tensors(guided, [5, 6, 7]), "req-1")
    assert body is not None
    sent = json.loads(body)
    assert sent["id"] == "req-1"
    assert sent["input_ids"] == [5, 6, 7]
    assert sent["streaming"] == [True]
    assert sent["sampling_param_seed"] == [2**64 - 1]  # uint64, exact
    assert sent["sampling_param_temperature"] == [0.5]
    assert sent["sampling_param_stop"] == ["END", " END"]
    assert sent["guided_decoding_guide"] == ['{"type":"object"}']


def test_direct_tensors_without_word_lists_go_as_json() -> None:
    ids = TokenIds(prompt_ids=[1, 2, 3], end_id=2, pad_id=0)
    sent = json.loads(generate_body(direct_tensors(SamplingParams(max_tokens=4), ids)) or b"")
    assert sent["input_ids"] == [1, 2, 3] and sent["request_output_len"] == [4]
    assert "id" not in sent


@pytest.mark.parametrize(
    "extra",
    [
        # The C++ backend's [1, 2, L] word lists: the generate extension cannot shape them.
        {"stop_words_list": np.array([[[5, 9], [2, -1]]], np.int32)},
        {"bad_words_list": np.array([[[5], [1]]], np.int32)},
        # LoRA weights and config of the C++ backend's cache protocol: [1, N, D].
        LoraTensors(7, np.zeros((1, 2, 8), np.float16), np.zeros((1, 2, 3), np.int32)).tensors(),
        # A batch of two rows.
        {"input_lengths": np.array([[3], [3]], np.int32)},
    ],
    ids=["stop_words", "bad_words", "lora_weights", "two_rows"],
)
def test_what_the_generate_extension_cannot_shape_goes_by_grpc(extra) -> None:
    ids = TokenIds(prompt_ids=[1, 2, 3], end_id=2, pad_id=0)
    assert generate_body({**direct_tensors(SamplingParams(), ids), **extra}) is None


def test_large_and_non_utf8_inputs_go_by_grpc() -> None:
    assert generate_body({"input_ids": np.zeros(MAX_JSON_VALUES, np.int32)}) is not None
    assert generate_body({"input_ids": np.zeros(MAX_JSON_VALUES + 1, np.int32)}) is None
    assert generate_body({"text_input": np.array([b"\xff\xfe"], np.object_)}) is None


def test_events_are_cut_where_they_end_whatever_the_chunks() -> None:
    stream = b'data: {"output_ids":1}\n\ndata: {"output_ids":[2,3]}\n\n'
    for cut in range(len(stream) + 1):
        events, rest = split_events(stream[:cut])
        more, rest = split_events(rest + stream[cut:])
        assert [json.loads(e) for e in events + more] == [{"output_ids": 1}, {"output_ids": [2, 3]}]
        assert rest == b""


@pytest.mark.parametrize(
    ("body", "message", "in_stream"),
    [
        (b'{"error":"Request for unknown model: \'x\' is not found"}',
         "Request for unknown model: 'x' is not found", False),
        (b'data: {"error":"input_ids hold token ids outside the vocabulary"}\n\n',
         "input_ids hold token ids outside the vocabulary", True),
        (b"upstream gone", "upstream gone", False),
    ],
)  # fmt: skip
def test_error_answers_are_read_as_triton_writes_them(body, message, in_stream) -> None:
    assert _error_message(body) == (message, in_stream)


# Triton's HTTP answer → the error, and the status the service answers with: the same as the
# same failure over gRPC (test_client_errors.py).
HTTP_ERRORS = [
    (GenerateError(400, "expected number of inputs between 2 and 61", False), EngineRequestError, 400),
    (GenerateError(400, "input_ids hold token ids outside the vocabulary", True), EngineModelError, 502),
    (GenerateError(404, "Request for unknown model: 'x' is not found", False), EngineModelError, 502),
    (GenerateError(500, "Unable to parse 'data'", False), EngineModelError, 502),
    (GenerateError(503, "Server is not ready", False), EngineUnavailableError, 503),
    (GenerateError(400, "Exceeds maximum queue size", False), EngineUnavailableError, 503),
    (GenerateError(504, "timed out", False), EngineTimeoutError, 504),
]  # fmt: skip


@pytest.mark.parametrize(("error", "kind", "status"), HTTP_ERRORS)
async def test_http_errors_map_to_honest_answers(error, kind, status) -> None:
    client = TritonLLMClient("127.0.0.1:1", http_url="http://127.0.0.1:1")
    try:
        mapped = client._generate_error("tensorrt_llm", error)
        assert type(mapped) is kind
        answer = answer_for(mapped)
        assert answer.status == status and error.message in answer.message
    finally:
        await client.close()


async def test_a_dead_stub_over_http_restarts_as_over_grpc() -> None:
    reported: list[str] = []
    client = TritonLLMClient(
        "127.0.0.1:1", on_dead_instance=reported.append, http_url="http://127.0.0.1:1"
    )
    try:
        error = GenerateError(400, "Stub process 'tensorrt_llm_0_0' is not healthy.", True)
        mapped = client._generate_error("tensorrt_llm", error)
        assert isinstance(mapped, EngineInstanceDeadError) and reported == ["tensorrt_llm_0_0"]
    finally:
        await client.close()


async def test_each_request_takes_the_transport_that_can_carry_it() -> None:
    ids = TokenIds(prompt_ids=[1, 2, 3], end_id=2, pad_id=0, stop_words_ids=np.array(
        [[[5, 9], [2, -1]]], np.int32))  # fmt: skip
    plain = direct_tensors(SamplingParams(), TokenIds(prompt_ids=[1, 2, 3], end_id=2, pad_id=0))
    with_words = direct_tensors(SamplingParams(), ids)
    both = TritonLLMClient("127.0.0.1:1", http_url="http://127.0.0.1:1")
    grpc_only = TritonLLMClient("127.0.0.1:1")
    try:
        chosen = {
            name: stream.ag_code.co_name
            for name, stream in [
                ("plain", both.stream("tensorrt_llm", plain, ["output_ids"], "a")),
                ("words", both.stream("tensorrt_llm", with_words, ["output_ids"], "b")),
                ("grpc_only", grpc_only.stream("tensorrt_llm", plain, ["output_ids"], "c")),
            ]
        }
        assert chosen == {
            "plain": "_stream_http",
            "words": "_stream_grpc",
            "grpc_only": "_stream_grpc",
        }
    finally:
        await both.close()
        await grpc_only.close()
