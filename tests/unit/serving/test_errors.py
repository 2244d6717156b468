"""The one error mapper (serving/errors.py): a client's mistake is a 4xx, the model server's
failures 5xx, Retry-After only where a retry can succeed (one value everywhere), an unexpected
error a 500 with a request id, logged once with its traceback; native and OpenAI bodies."""

from __future__ import annotations

import json
import logging

import pytest
from pydantic import ValidationError

from tensorrtllm_backend.common.engine_api import (
    EngineInstanceDeadError,
    EngineModelError,
    EngineRequestError,
    EngineTimeoutError,
    EngineUnavailableError,
)
from tensorrtllm_backend.common.guides import GuideBusyError
from tensorrtllm_backend.serving.errors import (
    RETRY_AFTER_S,
    answer_for,
    as_api_error,
    error_response,
)
from tensorrtllm_backend.serving.request_errors import RequestError
from tensorrtllm_backend.serving.schemas import GenerateRequest


def validation_error() -> ValidationError:
    with pytest.raises(ValidationError) as raised:
        GenerateRequest.model_validate({"prompt": "hi", "guided_decoding": {"type": "xml"}})
    return raised.value


CASES = [
    (RequestError("max_tokens 9 exceeds max_seq_len", param="max_tokens"), 400),
    (RequestError("unknown LoRA adapter 'x'", 404, param="lora"), 404),
    (RequestError("too big", 413), 413),
    (validation_error(), 400),
    (RecursionError("maximum recursion depth exceeded"), 400),
    (EngineRequestError("tensorrt_llm refused the request: bad input"), 400),
    (EngineUnavailableError("tritonserver stream ended: UNAVAILABLE"), 503),
    (EngineInstanceDeadError("stub dead", "tensorrt_llm_0_0"), 503),
    (GuideBusyError("16 guides are being compiled"), 503),
    (EngineModelError("tensorrt_llm: out of blocks"), 502),
    (EngineTimeoutError("DEADLINE_EXCEEDED"), 504),
]


@pytest.mark.parametrize(("error", "status"), CASES, ids=[type(e).__name__ for e, _ in CASES])
def test_each_error_has_its_honest_status(error: BaseException, status: int) -> None:
    answer = answer_for(error)
    assert answer.status == status
    assert answer.retry == (status == 503)
    for api in ("/generate_text", "/v1/completions"):
        response = error_response(error, api)
        assert response.status_code == status
        assert response.headers.get("retry-after") == (
            str(RETRY_AFTER_S) if status == 503 else None
        )


def test_client_mistakes_name_the_field() -> None:
    answer = answer_for(validation_error())
    assert answer.param == "guided_decoding.type"
    assert answer.message.startswith("guided_decoding.type: Input should be")
    deep = answer_for(RecursionError())
    assert deep.status == 400 and "nested too deeply" in deep.message


def test_native_and_openai_bodies() -> None:
    error = RequestError("prompt is too long", 400, param="prompt", code="context_length_exceeded")
    native = json.loads(error_response(error, "/generate_text").body)
    assert native == {"error": "prompt is too long"}
    openai = json.loads(error_response(error, "/v1/chat/completions").body)
    assert openai == {
        "error": {
            "message": "prompt is too long",
            "type": "invalid_request_error",
            "param": "prompt",
            "code": "context_length_exceeded",
        }
    }
    server = json.loads(error_response(EngineModelError("boom"), "/v1/completions").body)
    assert server["error"]["type"] == "server_error"


def test_an_unexpected_error_is_a_500_with_a_request_id_logged_once(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="bentoml.trtllm.errors")
    try:
        raise KeyError("a bug in the service")
    except KeyError as bug:
        response = error_response(bug, "/v1/chat/completions", request_id="abc123")
    body = json.loads(response.body)
    assert response.status_code == 500 and "retry-after" not in response.headers
    assert "request id abc123" in body["error"]["message"]
    assert "a bug in the service" not in body["error"]["message"]  # details stay in the log
    (record,) = caplog.records
    assert "abc123" in record.getMessage() and record.exc_info is not None
    # /generate's APIError for it is marked as logged: BentoML's log filter drops it
    caplog.clear()
    api_error = as_api_error(RuntimeError("another"), "/generate")
    assert api_error.status == 500 and api_error.logged
    assert len(caplog.records) == 1
