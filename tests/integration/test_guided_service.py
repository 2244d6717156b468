"""Guided decoding through the real service: the demo model's output, whatever its random weights
prefer, follows the JSON schema / regex / JSON it was given, on every route (the token-id routes,
direct and llmapi, through `route_server`; the text routes below)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import pytest

from tests.integration.conftest import BentoServer

pytestmark = pytest.mark.integration

TIMEOUT = 120
PROMPT = "Describe the weather as JSON:"
# Bounded on purpose: every string, array and number has an end the weak model must reach.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        "inner": {
            "type": "object",
            "properties": {"level": {"enum": ["low", "high"]}, "on": {"type": "boolean"}},
            "required": ["level", "on"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "color", "ok", "flags", "inner"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{3}-[0-9]{2,4}"


def guided(kind: str, guide: str | None = None, **fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": kind}
    if guide is not None:
        spec["guide"] = guide
    return {"prompt": PROMPT, "max_tokens": 256, "guided_decoding": spec, **fields}


def schema_request(**fields: Any) -> dict[str, Any]:
    return guided("json_schema", json.dumps(SCHEMA), **fields)


def generate_text(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/generate_text", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def assert_follows_schema(text: str) -> None:
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_schema_output_validates(route_server: BentoServer) -> None:
    greedy = generate_text(route_server.url, schema_request(temperature=0))
    assert_follows_schema(greedy["text"])
    assert greedy["finish_reason"] == "stop"
    sampled = generate_text(
        route_server.url,
        schema_request(temperature=1.0, top_k=50, seed=11, num_return_sequences=3),
    )
    texts = [sequence["text"] for sequence in sampled["sequences"]]
    for text in texts:
        assert_follows_schema(text)
    assert len(set(texts)) > 1  # one matcher per sequence, each sampled on its own


def test_streamed_generate_follows_the_schema(route_server: BentoServer) -> None:
    body = schema_request(temperature=0.7, top_p=0.95, seed=5)
    with httpx.stream(
        "POST", f"{route_server.url}/generate", json=body, timeout=TIMEOUT
    ) as response:
        assert response.status_code == 200, response.read()
        pieces = list(response.iter_text())
    assert len(pieces) > 1
    assert_follows_schema("".join(pieces))


def test_regex_and_json_guides(route_server: BentoServer) -> None:
    for seed in (1, 2):
        text = generate_text(
            route_server.url, guided("regex", REGEX, temperature=0.8, top_k=40, seed=seed)
        )["text"]
        assert re.fullmatch(REGEX, text), text
    # `json` without a guide: any JSON value (compact), ended by max_tokens or by the end token.
    result = generate_text(route_server.url, guided("json", temperature=0))
    if result["finish_reason"] == "stop":
        json.loads(result["text"])
    grammar = 'root ::= "yes" | "no" | "maybe"'
    text = generate_text(route_server.url, guided("ebnf_grammar", grammar, temperature=0))["text"]
    assert text in ("yes", "no", "maybe")


def test_guided_and_unguided_share_the_engine(route_server: BentoServer) -> None:
    plain = {"prompt": PROMPT, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    bodies = [schema_request(temperature=0.9, top_k=50, seed=i) for i in range(4)] + [plain] * 4
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(lambda body: generate_text(route_server.url, body), bodies))
    for result in results[:4]:
        assert_follows_schema(result["text"])
    unguided = [result for result in results[4:]]
    assert all(result["usage"]["completion_tokens"] == 48 for result in unguided)
    # The unguided text is the model's own, unchanged by the guided requests beside it.
    assert len({result["text"] for result in unguided}) == 1
    assert unguided[0]["text"] == generate_text(route_server.url, plain)["text"]


def test_bad_guide_takes_no_engine_slot(route_server: BentoServer) -> None:
    """A guide that does not compile is refused by the service: the engine never counts it."""
    bad = guided("regex", "(unclosed")
    response = httpx.post(f"{route_server.url}/generate_text", json=bad, timeout=TIMEOUT)
    assert response.status_code == 400
    assert "does not compile" in response.json()["error"]
    assert_follows_schema(generate_text(route_server.url, schema_request(temperature=0))["text"])


@pytest.mark.parametrize("route", ["ensemble", "bls"])
def test_text_routes_carry_the_guide(
    route: str, demo_model: str, bento_server_factory: Callable[..., BentoServer]
) -> None:
    server = bento_server_factory(demo_model, env={"TRTLLM_ROUTE": route})
    result = generate_text(server.url, schema_request(temperature=0))
    assert_follows_schema(result["text"])
    text = generate_text(server.url, guided("regex", REGEX, temperature=0))["text"]
    assert re.fullmatch(REGEX, text), text


def test_synthetic_engine_refuses_guides(
    synthetic_model: str, bento_server_factory: Callable[..., BentoServer]
) -> None:
    server = bento_server_factory(synthetic_model)
    response = httpx.post(f"{server.url}/generate_text", json=guided("json"), timeout=TIMEOUT)
    assert response.status_code == 400
    assert "synthetic" in response.json()["error"]


def test_openapi_documents_guided_decoding(demo_server: BentoServer) -> None:
    spec = httpx.get(f"{demo_server.url}/docs.json", timeout=TIMEOUT).json()
    text = json.dumps(spec)
    assert "guided_decoding" in text and "GuidedDecoding" in text
    for kind in ("json_schema", "regex", "ebnf_grammar", "structural_tag"):
        assert kind in text


def test_openapi_documents_the_mounted_apis(demo_server: BentoServer) -> None:
    """/docs.json lists the /v1 and root apps' routes beside BentoML's, and the Swagger UI that
    reads it (BentoML 1.4 serves it at /, not at /docs) still loads."""
    response = httpx.get(f"{demo_server.url}/docs.json", timeout=TIMEOUT)
    assert response.status_code == 200
    assert int(response.headers["content-length"]) == len(response.content)
    spec = response.json()
    paths = spec["paths"]
    assert {"/v1/messages", "/tokenize", "/health", "/generate_text"} <= set(paths)
    body = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    name = body["schema"]["$ref"].rsplit("/", 1)[1]
    assert "messages" in spec["components"]["schemas"][name]["properties"]
    page = httpx.get(f"{demo_server.url}/", timeout=TIMEOUT)
    assert page.status_code == 200 and "swagger" in page.text.lower()
