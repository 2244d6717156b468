"""Bad input against a real `bentoml serve` of the demo model: every case of the table is
a 4xx whose body names what to fix, never a 500 and never a hang; afterwards the server is healthy,
and a stream running during a barrage of bad requests completes intact."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import BentoServer  # tests/integration/conftest.py

pytestmark = pytest.mark.integration

TIMEOUT = httpx.Timeout(20.0)  # no case may hang: each request has a hard limit
MODEL = "trtllm-demo"  # the demo model's served name (checked in test_table_model_name)
LONG_PROMPT = "story " * 2000  # beyond the demo's max_input_len (256 tokens)
BIG = 5 * 1024 * 1024  # above the 4 MiB request limit
# A JSON schema nested 80 levels deep (40 objects in objects).
DEEP_SCHEMA = '{"type": "object", "properties": {"a": ' * 40 + "{}" + "}}" * 40


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: dict[str, Any] | bytes
    expect: str  # a substring of the error body (lower case) that says what to fix
    status: tuple[int, ...] = (400,)

    def content(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


def _native(name: str, body: dict[str, Any] | bytes, expect: str, *status: int) -> list[Case]:
    return [
        Case(f"{api}-{name}", f"/{api}", body, expect, status or (400,))
        for api in ("generate", "generate_text")
    ]


def _guide(name: str, kind: str, guide: str, expect: str) -> list[Case]:
    """A native request whose guided_decoding guide of type `kind` does not compile."""
    return _native(
        name, {"prompt": "hi", "guided_decoding": {"type": kind, "guide": guide}}, expect
    )


def _openai(name: str, body: dict[str, Any] | bytes, expect: str, *status: int,
            chat: bool | None = None) -> list[Case]:  # fmt: skip
    cases = []
    for kind in ("completions", "chat"):
        if chat is not None and chat != (kind == "chat"):
            continue
        if isinstance(body, dict):
            base: dict[str, Any] = {"model": MODEL, "max_tokens": 4}
            base.update({"prompt": "Hello"} if kind == "completions" else
                        {"messages": [{"role": "user", "content": "Hello"}]})  # fmt: skip
            payload: dict[str, Any] | bytes = {**base, **body}
            payload = {k: v for k, v in payload.items() if v is not _DROP}
        else:
            payload = body
        path = "/v1/completions" if kind == "completions" else "/v1/chat/completions"
        cases.append(Case(f"{kind}-{name}", path, payload, expect, status or (400,)))
    return cases


_DROP = object()  # marks a field to remove from the OpenAI base request
# pydantic's words for a value of the wrong type (strict: no coercion), lower-cased
INT, BOOL, NUM, STR = (
    f"input should be a valid {t}" for t in ("integer", "boolean", "number", "string")
)

NATIVE_CASES = [
    *_native("prompt-wrong-type", {"prompt": 123}, "prompt"),
    *_native("prompt-null", {"prompt": None}, "prompt"),
    *_native("prompt-list", {"prompt": ["a", "b"]}, "prompt"),
    *_native("prompt-missing", {"max_tokens": 3}, "prompt"),
    *_native("prompt-empty", {"prompt": ""}, "prompt"),
    *_native("prompt-blank", {"prompt": "   \n"}, "prompt is blank"),
    *_native("prompt-too-long", {"prompt": LONG_PROMPT}, "max_input_len"),
    *_native("max-tokens-zero", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    *_native("max-tokens-negative", {"prompt": "hi", "max_tokens": -5}, "max_tokens"),
    *_native("max-tokens-beyond-engine", {"prompt": "hi", "max_tokens": 100000}, "max_seq_len"),
    *_native("max-tokens-string", {"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
    *_native("temperature-nan", b'{"prompt": "hi", "temperature": NaN}', "temperature"),
    *_native("temperature-infinity", b'{"prompt": "hi", "temperature": Infinity}', "temperature"),
    *_native("temperature-negative", {"prompt": "hi", "temperature": -1}, "temperature"),
    *_native("temperature-huge", {"prompt": "hi", "temperature": 1e30}, "temperature"),
    *_native("top-p-zero", {"prompt": "hi", "top_p": 0}, "top_p"),
    *_native("top-p-above-one", {"prompt": "hi", "top_p": 1.5}, "top_p"),
    *_native("top-k-negative", {"prompt": "hi", "top_k": -1}, "top_k"),
    *_native("repetition-penalty-zero", {"prompt": "hi", "repetition_penalty": 0}, "repetition"),
    *_native("presence-penalty-big", {"prompt": "hi", "presence_penalty": 5}, "presence"),
    *_native("seed-negative", {"prompt": "hi", "seed": -1}, "seed"),
    *_native("seed-above-uint64", {"prompt": "hi", "seed": 2**64}, "seed"),
    *_native("end-id-negative", {"prompt": "hi", "end_id": -1}, "end_id"),
    *_native("min-over-max", {"prompt": "hi", "max_tokens": 2, "min_tokens": 5}, "min_tokens"),
    *_native("stop-1000", {"prompt": "hi", "stop": [f"w{i}" for i in range(1000)]}, "stop"),
    *_native("stop-empty-word", {"prompt": "hi", "stop": [""]}, "stop"),
    *_native("stop-word-too-long", {"prompt": "hi", "stop": ["x" * 5000]}, "stop"),
    *_native("bad-words-1000", {"prompt": "hi", "bad_words": ["w"] * 1000}, "bad_words"),
    *_native("beam-width-unsupported", {"prompt": "hi", "beam_width": 2}, "max_beam_width"),
    *_native("beam-width-zero", {"prompt": "hi", "beam_width": 0}, "beam_width"),
    *_native("sequences-zero", {"prompt": "hi", "num_return_sequences": 0}, "num_return_seq"),
    *_native("sequences-above-64", {"prompt": "hi", "num_return_sequences": 65}, "num_return_seq"),
    *_native(
        "sequences-with-beams",
        {"prompt": "hi", "num_return_sequences": 2, "beam_width": 2},
        "beam_width 1",
    ),  # fmt: skip
    Case(
        "generate-sequences-streamed",
        "/generate",
        {"prompt": "hi", "num_return_sequences": 2},
        "generate_text",
    ),  # fmt: skip
    *_native("unknown-field", {"prompt": "hi", "temprature": 0.5}, "temprature"),
    *_native("log-probs-wrong-type", {"prompt": "hi", "return_log_probs": "maybe"}, "log_probs"),
    *_native("top-log-probs-alone", {"prompt": "hi", "top_log_probs": 2}, "needs return_log"),
    *_native(
        "top-log-probs-above-20",
        {"prompt": "hi", "return_log_probs": True, "top_log_probs": 21},
        "top_log_probs",
    ),  # fmt: skip
    *_native("malformed-json", b'{"prompt": "hi"', "json"),
    *_native("non-utf8", b'{"prompt": "\xff\xfe hi"}', "json"),
    *_native("not-an-object", b"[1, 2]", "object"),
    *_native("oversized-body", {"prompt": "x" * BIG}, "larger than", 413),
    *_native("guide-type-unknown", {"prompt": "hi", "guided_decoding": {"type": "xml"}}, "type"),
    *_native(
        "guide-missing", {"prompt": "hi", "guided_decoding": {"type": "regex"}}, "needs a guide"
    ),
    *_guide("guide-schema-not-json", "json_schema", "{type: object", "not valid json"),
    *_guide("guide-schema-invalid", "json_schema", '{"type": 7}', "not a valid json schema"),
    # The compiler's own words: where the regex / grammar breaks.
    *_guide("guide-regex-unclosed", "regex", "[a-", "unclosed '['"),
    *_guide("guide-grammar-undefined-rule", "ebnf_grammar", "root ::= item", "is not defined"),
    *_guide(
        "guide-schema-bad-ref", "json_schema", '{"$ref": "#/$defs/missing"}', "does not compile"
    ),
    # Nested deeper than any schema needs: refused by depth, not by exhausting a recursion (500).
    *_guide("guide-schema-deep", "json_schema", DEEP_SCHEMA, "nested more than 64 levels"),
    *_guide("guide-schema-very-deep", "json_schema", "[" * 100_000 + "]" * 100_000, "nested"),
    *_native(
        "body-very-deep",
        b'{"prompt": "hi", "stop": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "invalid json: recursion limit exceeded",
    ),  # fmt: skip
    # No coercion from strings (or numbers) to booleans and numbers; the message names the field.
    *_native(
        "max-tokens-numeric-string", {"prompt": "hi", "max_tokens": "10"}, f"max_tokens: {INT}"
    ),
    *_native("max-tokens-float", {"prompt": "hi", "max_tokens": 10.0}, f"max_tokens: {INT}"),
    *_native("ignore-eos-yes", {"prompt": "hi", "ignore_eos": "yes"}, f"ignore_eos: {BOOL}"),
    *_native("ignore-eos-one", {"prompt": "hi", "ignore_eos": 1}, f"ignore_eos: {BOOL}"),
    *_native("temperature-string", {"prompt": "hi", "temperature": "0.5"}, f"temperature: {NUM}"),
    *_native("seed-bool", {"prompt": "hi", "seed": True}, f"seed: {INT}"),
    *_native("stop-word-number", {"prompt": "hi", "stop": [1]}, f"stop[0]: {STR}"),
]

OPENAI_CASES = [
    *_openai("model-missing", {"model": _DROP}, "model"),
    *_openai("model-unknown", {"model": "nope"}, "does not exist", 404),
    *_openai("prompt-missing", {"prompt": _DROP}, "prompt", chat=False),
    *_openai("prompt-empty", {"prompt": ""}, "prompt", chat=False),
    *_openai("prompt-batch-empty", {"prompt": ["a", " "]}, "prompt 1 is empty", chat=False),
    *_openai("prompt-token-outside", {"prompt": [1, 99999999]}, "vocabulary", chat=False),
    *_openai("prompt-too-long", {"prompt": LONG_PROMPT}, "context_length_exceeded", chat=False),
    *_openai("suffix", {"suffix": "end"}, "suffix", chat=False),
    *_openai("logprobs-above-5", {"logprobs": 10}, "logprobs", chat=False),
    *_openai("messages-missing", {"messages": _DROP}, "messages", chat=True),
    *_openai("messages-empty", {"messages": []}, "messages", chat=True),
    *_openai(
        "role-unknown", {"messages": [{"role": "wizard", "content": "x"}]}, "role", chat=True
    ),  # fmt: skip
    *_openai(
        "image-content",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "does not take images",
        chat=True,
    ),  # fmt: skip
    *_openai(
        "audio-content",
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
        "not supported",
        chat=True,
    ),  # fmt: skip
    *_openai(
        "too-long-message",
        {"messages": [{"role": "user", "content": LONG_PROMPT}]},
        "context_length_exceeded",
        chat=True,
    ),  # fmt: skip
    *_openai("top-logprobs-alone", {"top_logprobs": 2}, "top_logprobs needs logprobs", chat=True),
    *_openai(
        "top-logprobs-above-20", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", chat=True
    ),  # fmt: skip
    *_openai("max-tokens-zero", {"max_tokens": 0}, "max_tokens"),
    *_openai("max-tokens-negative", {"max_tokens": -1}, "max_tokens"),
    *_openai("max-tokens-beyond-engine", {"max_tokens": 100000}, "max_seq_len"),
    *_openai("max-completion-tokens-zero", {"max_completion_tokens": 0}, "max_completion"),
    *_openai(
        "temperature-nan",
        b'{"model": "trtllm-demo", "prompt": "hi", "temperature": NaN}',
        "temperature",
        chat=False,
    ),  # fmt: skip
    *_openai("temperature-negative", {"temperature": -0.5}, "temperature"),
    *_openai("temperature-above-2", {"temperature": 3}, "temperature"),
    *_openai("top-p-zero", {"top_p": 0}, "top_p"),
    *_openai("top-p-above-one", {"top_p": 1.01}, "top_p"),
    *_openai("top-k-negative", {"top_k": -3}, "top_k"),
    *_openai("presence-penalty-big", {"presence_penalty": 3}, "presence_penalty"),
    *_openai("seed-negative", {"seed": -1}, "seed"),
    *_openai("stop-1000", {"stop": [f"w{i}" for i in range(1000)]}, "stop"),
    *_openai("stop-empty", {"stop": ""}, "stop"),
    *_openai("n-above-64", {"n": 65}, "n is at most"),
    *_openai("n-zero", {"n": 0}, "n"),
    *_openai("stream-options-wrong-type", {"stream_options": "yes"}, "stream_options"),
    *_openai("malformed-json", b'{"model": "trtllm-demo", "prompt": ', "not valid json"),
    *_openai("non-utf8", b'{"model": "trtllm-demo", "prompt": "\xff\xfe"}', "not valid json"),
    *_openai("not-an-object", b"[1, 2]", "object"),
    # Strict types at the API edge: no string for a boolean or a number.
    *_openai("stream-as-string", {"stream": "yes"}, "stream"),
    *_openai("max-tokens-as-string", {"max_tokens": "10"}, "max_tokens"),
    *_openai("temperature-as-string", {"temperature": "0.5"}, "temperature"),
    # Fields of OpenAI's request that cannot be honoured here.
    *_openai("logit-bias", {"logit_bias": {"42": 10}}, "logit_bias"),
    *_openai("legacy-functions", {"functions": [{"name": "f"}]}, "send tools", chat=True),
    *_openai("legacy-function-call", {"function_call": "auto"}, "send tool_choice", chat=True),
    *_openai("audio-modality", {"modalities": ["text", "audio"]}, "modalities", chat=True),
    # response_format and guided_*.
    *_openai("response-format-xml", {"response_format": {"type": "xml"}}, "response_format"),
    *_openai(
        "json-schema-missing", {"response_format": {"type": "json_schema"}}, "json_schema"
    ),  # fmt: skip
    *_openai(
        "json-schema-not-a-schema",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            }
        },
        "not a valid json schema",
    ),  # fmt: skip
    *_openai(
        "json-schema-not-an-object",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}},
        "schema",
    ),  # fmt: skip
    *_openai(
        "json-schema-bad-name",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
        "name",
    ),  # fmt: skip
    *_openai(
        "two-constraints",
        {"response_format": {"type": "json_object"}, "guided_regex": "a+"},
        "one output constraint",
    ),  # fmt: skip
    *_openai("guided-json-not-json", {"guided_json": "{nope"}, "not valid json"),
    *_openai("guided-regex-broken", {"guided_regex": "(["}, "regex"),
    *_openai("guided-grammar-broken", {"guided_grammar": "root ::= "}, "grammar"),
    # Over the guide length limit, or nested too deeply: a 400 naming the field (not a 500).
    *_openai("guided-regex-too-long", {"guided_regex": "a" * 256_001}, "at most 256000"),
    *_openai(
        "response-format-schema-too-long",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"enum": ["x" * 256_000]}},
            }
        },
        "response_format makes a guide",
    ),  # fmt: skip
    *_openai(
        "response-format-schema-deep",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": json.loads(DEEP_SCHEMA)},
            }
        },
        "nested more than 64 levels",
    ),  # fmt: skip
    *_openai(
        "body-very-deep", b'{"model": "trtllm-demo", "prompt": ' + b"[" * 100_000, "not valid json"
    ),  # fmt: skip
    # Tools.
    *_openai(
        "tool-type-unknown",
        {"tools": [{"type": "retrieval", "function": {"name": "f"}}]},
        "tools",
        chat=True,
    ),  # fmt: skip
    *_openai(
        "tool-name-invalid",
        {"tools": [{"type": "function", "function": {"name": "get weather"}}]},
        "name",
        chat=True,
    ),  # fmt: skip
    *_openai(
        "tool-parameters-not-an-object",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
        "parameters",
        chat=True,
    ),  # fmt: skip
    *_openai(
        "tool-parameters-not-a-schema",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
            ],
            "tool_choice": "required",
        },
        "not a valid json schema",
        chat=True,
    ),  # fmt: skip
    *_openai(
        "tool-choice-unknown-tool",
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        "not among the tools",
        chat=True,
    ),  # fmt: skip
    *_openai("tool-choice-without-tools", {"tool_choice": "required"}, "needs tools", chat=True),
    *_openai(
        "tool-choice-unknown-word",
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"},
        "tool_choice",
        chat=True,
    ),  # fmt: skip
    *_openai(
        "tool-choice-and-response-format",
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "required",
            "response_format": {"type": "json_object"},
        },
        "cannot be combined",
        chat=True,
    ),  # fmt: skip
    *_openai(
        "tool-message-without-call-id",
        {"messages": [{"role": "tool", "content": "14 degrees"}]},
        "tool_call_id",
        chat=True,
    ),  # fmt: skip
    *_openai(
        "tool-call-arguments-not-json",
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{city: Paris"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
            ]
        },
        "not valid json",
        chat=True,
    ),  # fmt: skip
    *_openai(
        "oversized-body",
        {"prompt": "x" * BIG, "messages": [{"role": "user", "content": "x" * BIG}]},
        "larger than",
        413,
    ),  # fmt: skip
]

CASES = NATIVE_CASES + OPENAI_CASES


def _check(case: Case, response: httpx.Response) -> None:
    assert response.status_code in case.status, (case.name, response.status_code, response.text)
    assert case.expect in response.text.lower(), (case.name, response.text[:500])


def test_native_validation_errors_name_the_field_not_the_schema_class(
    demo_server: BentoServer,
) -> None:
    for path in ("/generate", "/generate_text"):
        response = httpx.post(
            demo_server.url + path, json={"prompt": "hi", "max_tokens": "10"}, timeout=TIMEOUT
        )
        assert response.status_code == 400, response.text
        body = response.json()
        assert body["error"] == "max_tokens: Input should be a valid integer", body
        assert "IODescriptor" not in response.text


def test_json_integer_fills_a_float_field(demo_server: BentoServer) -> None:
    response = httpx.post(
        f"{demo_server.url}/generate_text",
        json={"prompt": "Once upon a time", "max_tokens": 2, "temperature": 1, "top_p": 1},
        timeout=TIMEOUT,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1


def test_table_is_big_enough(demo_server: BentoServer) -> None:
    assert len({c.name for c in CASES}) == len(CASES) >= 40
    assert httpx.get(f"{demo_server.url}/v1/models", timeout=TIMEOUT).json()["data"][0]["id"] == (
        MODEL
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_a_4xx_naming_the_problem(demo_server: BentoServer, case: Case) -> None:
    response = httpx.post(
        demo_server.url + case.path, content=case.content(),
        headers={"content-type": "application/json"}, timeout=TIMEOUT,
    )  # fmt: skip
    _check(case, response)


@pytest.mark.parametrize("path", ["/generate_text", "/v1/completions"])
def test_oversized_chunked_body_without_length_is_rejected(demo_server, path: str) -> None:
    """No Content-Length header: the size limit must hold on the bytes actually received."""

    def body() -> Any:
        yield b'{"model": "trtllm-demo", "prompt": "'
        for _ in range(BIG // (1024 * 1024)):
            yield b"x" * (1024 * 1024)
        yield b'"}'

    response = httpx.post(
        demo_server.url + path, content=body(), headers={"content-type": "application/json"},
        timeout=TIMEOUT,
    )  # fmt: skip
    assert 400 <= response.status_code < 500, response.text[:300]
    assert "larger than" in response.text or "at most" in response.text


def test_special_token_stop_word_is_accepted(demo_server: BentoServer) -> None:
    """A stop word the text can never contain (the end token's text) is harmless, not an error."""
    response = httpx.post(
        f"{demo_server.url}/generate_text",
        json={"prompt": "hi", "stop": ["</s>"], "max_tokens": 4, "ignore_eos": True},
        timeout=TIMEOUT,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4


def test_server_healthy_after_the_table(demo_server: BentoServer) -> None:
    for case in CASES[::3]:  # a sample again, then health
        httpx.post(demo_server.url + case.path, content=case.content(), timeout=TIMEOUT)
    assert httpx.get(f"{demo_server.url}/readyz", timeout=TIMEOUT).status_code == 200
    response = httpx.post(
        f"{demo_server.url}/generate_text", json={"prompt": "hello", "max_tokens": 4},
        timeout=TIMEOUT,
    )  # fmt: skip
    assert response.status_code == 200 and response.json()["text"]


async def test_stream_survives_a_concurrent_barrage(demo_server: BentoServer) -> None:
    request = {"prompt": "Once upon a time", "max_tokens": 120, "temperature": 0.0,
               "ignore_eos": True}  # fmt: skip
    async with httpx.AsyncClient(base_url=demo_server.url, timeout=TIMEOUT) as client:
        reference = (await client.post("/generate_text", json=request)).json()["text"]

        async def stream() -> str:
            parts = []
            async with client.stream("POST", "/generate", json=request) as response:
                assert response.status_code == 200
                async for text in response.aiter_text():
                    parts.append(text)
            return "".join(parts)

        async def barrage() -> list[tuple[Case, httpx.Response]]:
            semaphore = asyncio.Semaphore(8)

            async def send(case: Case) -> tuple[Case, httpx.Response]:
                async with semaphore:
                    response = await client.post(
                        case.path, content=case.content(),
                        headers={"content-type": "application/json"},
                    )  # fmt: skip
                    return case, response

            return await asyncio.gather(*(send(c) for c in CASES))

        streamed, answers = await asyncio.gather(stream(), barrage())
    assert streamed == reference
    for case, response in answers:
        _check(case, response)
