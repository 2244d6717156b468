"""`/docs.json` documents the mounted Starlette apps (serving/openapi_docs.py): every route the
service serves is in BentoML's spec once merged, with its request body's schema, and the
middleware changes that one answer only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from tensorrtllm_backend.serving.apis import APIS
from tensorrtllm_backend.serving.metrics_export import build_triton_metrics_app
from tensorrtllm_backend.serving.openapi_docs import (
    DOCS_PATH,
    OPERATIONS,
    UNDOCUMENTED,
    Mounts,
    OpenAPIDocsMiddleware,
    build_extras,
    merge,
    served_routes,
)


def mounts() -> Mounts:
    """service.py's mounts, with the optional relay of Triton's metrics."""
    import service

    apps = list(service.TRTLLM.mount_apps)
    if not any(prefix == "/triton" for _app, prefix, _name in apps):
        apps.append((build_triton_metrics_app(lambda: None), "/triton", "triton"))
    return apps


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    import service

    return merge(service.TRTLLM.openapi_spec.asdict(), build_extras(mounts()))


def openapi_path(path: str) -> str:
    return path.replace("{model_id:path}", "{model_id}")


def refs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def resolve(spec: dict[str, Any], ref: str) -> dict[str, Any]:
    assert ref.startswith("#/components/schemas/"), ref
    return spec["components"]["schemas"][ref.rsplit("/", 1)[1]]  # type: ignore[no-any-return]


def test_every_served_route_has_an_entry() -> None:
    """A route added to a mounted app fails here until OPERATIONS describes it."""
    served = {(path, method) for path, method in served_routes(mounts())}
    missing = {key for key in served if key not in OPERATIONS and key[0] not in UNDOCUMENTED}
    assert not missing, f"add these to OPERATIONS in serving/openapi_docs.py: {sorted(missing)}"
    assert set(OPERATIONS) <= served, "OPERATIONS describes routes nobody serves"


def test_every_registered_path_served_by_a_mounted_app_is_documented(
    spec: dict[str, Any],
) -> None:
    served = {path for path, _method in served_routes(mounts())}
    for api in APIS:
        if api.path not in served or api.path in UNDOCUMENTED:
            continue
        item = spec["paths"].get(openapi_path(api.path))
        assert item, f"{api.path} is not in /docs.json"
        for (path, method), operation in OPERATIONS.items():
            if path != api.path:
                continue
            documented = item[method.lower()]
            assert documented["summary"] == operation.summary
            if operation.body is None:
                assert "requestBody" not in documented
                continue
            schema = documented["requestBody"]["content"]["application/json"]["schema"]
            assert resolve(spec, schema["$ref"])["properties"], f"{method} {path}"


def test_the_spec_refers_only_to_schemas_it_holds_and_keeps_bentomls(spec: dict[str, Any]) -> None:
    assert all(resolve(spec, ref) for ref in refs(spec))
    assert "$defs" not in json.dumps(spec)
    assert {"/generate", "/generate_text", "/readyz"} <= set(spec["paths"])
    assert "GuidedDecoding" in spec["components"]["schemas"]  # the native API's, still there
    assert {tag["name"] for tag in spec["tags"]} >= {"OpenAI", "Anthropic Messages", "vLLM"}
    operation_ids = [
        op["operationId"] for item in spec["paths"].values() for op in item.values()
        if "operationId" in op  # BentoML's probes have none
    ]  # fmt: skip
    assert len(operation_ids) == len(set(operation_ids))


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"model": "m", "prompt": "hi", "stream": True}),
        ("/v1/responses", {"model": "m", "input": "hi"}),
        ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "user",
                                                                       "content": "hi"}]}),
        ("/tokenize", {"prompt": "hi"}),
        ("/detokenize", {"tokens": [1, 2]}),
    ],
)  # fmt: skip
def test_request_schemas_accept_a_real_request(
    spec: dict[str, Any], path: str, body: dict[str, Any]
) -> None:
    """The hoisted schemas resolve as JSON Schema, and a request the API takes passes them."""
    reference = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    schema = {**reference["schema"], "components": spec["components"]}
    jsonschema.Draft202012Validator(schema).validate(body)


def test_streams_and_error_shapes_follow_the_registry(spec: dict[str, Any]) -> None:
    def operation(path: str, method: str = "post") -> dict[str, Any]:
        return spec["paths"][path][method]  # type: ignore[no-any-return]

    chat = operation("/v1/chat/completions")
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    assert "messages" in resolve(spec, chat["requestBody"]["content"]["application/json"]
                                 ["schema"]["$ref"])["properties"]  # fmt: skip
    assert "text/event-stream" in operation("/v1/messages")["responses"]["200"]["content"]
    assert "text/event-stream" not in operation("/v1/models", "get")["responses"]["200"]["content"]

    def error(path: str, method: str = "post") -> dict[str, Any]:
        ref = operation(path, method)["responses"]["default"]["content"]["application/json"]
        return resolve(spec, ref["schema"]["$ref"])

    assert set(error("/v1/chat/completions")["properties"]) == {"error"}
    assert "message" in resolve(spec, error("/tokenize")["properties"]["error"]["$ref"])["required"]
    assert set(error("/v1/messages")["properties"]) == {"type", "error"}
    assert error("/health", "get")["properties"]["error"]["type"] == "string"
    model = operation("/v1/models/{model_id}", "get")
    assert model["parameters"][0]["name"] == "model_id"
    assert "content" not in operation("/health", "get")["responses"]["200"]


def docs_app(status: int = 200) -> Starlette:
    """A stand-in for BentoML's app: its spec at /docs.json, and another route."""

    async def docs(request: Request) -> Response:
        body = {"openapi": "3.0.2", "paths": {"/generate": {"post": {}}}, "tags": []}
        return JSONResponse(body, status_code=status)

    async def other(request: Request) -> Response:
        return PlainTextResponse("untouched")

    return Starlette(routes=[Route(DOCS_PATH, docs), Route("/other", other)])


def test_the_middleware_merges_docs_json_and_passes_the_rest() -> None:
    mounted = Starlette(routes=[Route("/tokenize", docs_app(), methods=["POST"])])
    app = OpenAPIDocsMiddleware(docs_app(), mounts=[(mounted, "/", "root")])
    with TestClient(app) as client:
        response = client.get(DOCS_PATH)
        assert response.status_code == 200
        assert int(response.headers["content-length"]) == len(response.content)
        spec = response.json()
        assert set(spec["paths"]) == {"/generate", "/tokenize"}
        schema = spec["paths"]["/tokenize"]["post"]["requestBody"]["content"]["application/json"]
        assert "TokenizeRequest" in spec["components"]["schemas"]
        assert schema["schema"] == {"$ref": "#/components/schemas/TokenizeRequest"}
        assert client.get("/other").text == "untouched"
        assert client.post(DOCS_PATH).status_code == 405  # not GET: BentoML's answer


def test_the_middleware_leaves_an_error_as_it_is() -> None:
    app = OpenAPIDocsMiddleware(docs_app(status=500), mounts=[])
    with TestClient(app) as client:
        response = client.get(DOCS_PATH)
    assert response.status_code == 500
    assert set(response.json()["paths"]) == {"/generate"}
