"""The native APIs' wording of schema-validation errors (errors.plain_validation_error and the
middleware's ASGI rewording), on bodies as BentoML 1.4 renders a pydantic ValidationError."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from tensorrtllm_backend.serving.errors import NativeErrorMiddleware, plain_validation_error
from tensorrtllm_backend.serving.schemas import GenerateRequest


def bentoml_body(error: ValidationError) -> dict[str, object]:
    """What BentoML's HTTP app answers for a ValidationError (its api_endpoint_wrapper)."""
    return {
        "error": f"{error.error_count()} validation error for GenerateRequestIODescriptor",
        "detail": error.errors(include_context=False, include_input=False),
    }


def validation_error(body: str) -> ValidationError:
    with pytest.raises(ValidationError) as raised:
        GenerateRequest.model_validate_json(body)
    return raised.value


def test_fields_are_named_in_plain_words() -> None:
    error = validation_error('{"prompt": "hi", "max_tokens": "10", "stop": ["a", 1]}')
    reworded = plain_validation_error(json.loads(json.dumps(bentoml_body(error))))
    assert reworded is not None
    assert reworded["error"] == (
        "max_tokens: Input should be a valid integer; stop[1]: Input should be a valid string"
    )
    assert "IODescriptor" not in json.dumps(reworded)


def test_nested_fields_are_dotted() -> None:
    error = validation_error('{"prompt": "hi", "guided_decoding": {"type": 3}}')
    reworded = plain_validation_error(bentoml_body(error))
    assert reworded is not None and str(reworded["error"]).startswith("guided_decoding.type: ")


def test_other_bodies_are_not_touched() -> None:
    assert plain_validation_error({"error": "prompt is blank: send some text"}) is None
    assert plain_validation_error([{"error": "x"}]) is None
    assert plain_validation_error({"error": "1 validation error for X", "detail": "x"}) is None


def run_app(status: int, body: bytes, path: str) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request through NativeErrorMiddleware around an app answering (status, body)."""

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body[:5], "more_body": True})
        await send({"type": "http.response.body", "body": body[5:], "more_body": False})

    sent: list[dict] = []

    async def send(message):  # type: ignore[no-untyped-def]
        sent.append(message)

    async def receive():  # type: ignore[no-untyped-def]
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "path": path, "method": "POST", "headers": []}
    asyncio.run(NativeErrorMiddleware(app)(scope, receive, send))
    start, *bodies = sent
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in bodies)


@pytest.mark.parametrize("path", ["/generate", "/generate_text"])
def test_the_middleware_rewords_bentomls_400(path: str) -> None:
    error = validation_error('{"prompt": "hi", "ignore_eos": "yes"}')
    status, headers, body = run_app(400, json.dumps(bentoml_body(error)).encode(), path)
    assert status == 400
    assert json.loads(body)["error"] == "ignore_eos: Input should be a valid boolean"
    assert headers[b"content-length"] == str(len(body)).encode()


def test_the_middleware_passes_other_answers_unchanged() -> None:
    ours = json.dumps({"error": "max_tokens: 100000 exceeds max_seq_len"}).encode()
    assert run_app(400, ours, "/generate_text")[2] == ours
    ok = json.dumps({"text": "x"}).encode()
    assert run_app(200, ok, "/generate_text")[2] == ok
    error = validation_error('{"prompt": "hi", "ignore_eos": "yes"}')
    raw = json.dumps(bentoml_body(error)).encode()
    assert run_app(400, raw, "/v1/completions")[2] == raw  # not a native path
