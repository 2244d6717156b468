"""The OpenAPI schema of the APIs served by the mounted Starlette apps, merged into BentoML's.

BentoML's `/docs.json` (and the Swagger UI that reads it) documents its own `@bentoml.api`
endpoints and only mounted *FastAPI* apps; the /v1 app and the root app here are Starlette, so
their routes would be missing. :class:`OpenAPIDocsMiddleware` lets BentoML answer `/docs.json`
and adds a path item for every route of the mounted apps: its summary and request body from
:data:`OPERATIONS`, whether it streams and how it words its errors from the registry
(:mod:`.apis`). The paths are read from the mounted apps themselves, so a route added later is
documented even before it has an entry here, and `tests/unit/serving/test_openapi_docs.py` fails
until it has one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .anthropic_api.protocol import CountTokensRequest, MessagesRequest
from .apis import ErrorStyle, api_for
from .openai_api.protocol import ChatCompletionRequest, CompletionRequest
from .responses_api.protocol import ResponsesRequest
from .vllm_api.tokenize import DetokenizeRequest, TokenizeRequest

DOCS_PATH = "/docs.json"
REF_TEMPLATE = "#/components/schemas/{model}"
# BentoML's service.mount_apps: (app, mount path, name).
Mounts = Sequence[tuple[Any, str, str]]

OPENAI = "OpenAI"
RESPONSES = "OpenAI Responses"
ANTHROPIC = "Anthropic Messages"
VLLM = "vLLM"
TRITON = "Triton"
TAGS: dict[str, str] = {
    OPENAI: "OpenAI-compatible completions, chat completions and models (/v1).",
    RESPONSES: "OpenAI's Responses API (/v1/responses).",
    ANTHROPIC: "Anthropic's Messages API (/v1/messages).",
    VLLM: "vLLM's routes at the root: readiness and the tokenizer.",
    TRITON: "tritonserver's own metrics, relayed.",
}


@dataclass(frozen=True, slots=True)
class Operation:
    """What the docs say about one method of one served path."""

    tag: str
    summary: str
    body: type[BaseModel] | None = None  # the request body's model; None: no body
    json_answer: bool = True  # False: a 200 has no JSON body (a probe, a metrics page)


# Keyed by the served path as Starlette spells it (mount path + route path) and the method.
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("/v1/completions", "POST"): Operation(OPENAI, "Create a completion", CompletionRequest),
    ("/v1/chat/completions", "POST"): Operation(
        OPENAI, "Create a chat completion", ChatCompletionRequest
    ),
    ("/v1/models", "GET"): Operation(OPENAI, "List the served models (base model, adapters)"),
    ("/v1/models/{model_id:path}", "GET"): Operation(OPENAI, "Retrieve a served model"),
    ("/v1/responses", "POST"): Operation(RESPONSES, "Create a response", ResponsesRequest),
    ("/v1/responses/{response_id}", "GET"): Operation(RESPONSES, "Retrieve a stored response"),
    ("/v1/responses/{response_id}", "DELETE"): Operation(RESPONSES, "Delete a stored response"),
    ("/v1/responses/{response_id}/cancel", "POST"): Operation(
        RESPONSES, "Cancel a response in progress"
    ),
    ("/v1/responses/{response_id}/input_items", "GET"): Operation(
        RESPONSES, "List a stored response's input items"
    ),
    ("/v1/messages", "POST"): Operation(ANTHROPIC, "Create a message", MessagesRequest),
    ("/v1/messages/count_tokens", "POST"): Operation(
        ANTHROPIC, "Count a message request's input tokens", CountTokensRequest
    ),
    ("/health", "GET"): Operation(
        VLLM, "Readiness: 200 (empty) while serving, 503 with the reason", json_answer=False
    ),
    ("/tokenize", "POST"): Operation(VLLM, "Tokenize a prompt or chat messages", TokenizeRequest),
    ("/detokenize", "POST"): Operation(VLLM, "Turn token ids back into text", DetokenizeRequest),
    ("/tokenizer_info", "GET"): Operation(VLLM, "Describe the served tokenizer"),
    ("/triton/metrics", "GET"): Operation(
        TRITON,
        "tritonserver's Prometheus metrics (TRTLLM_EXPORT_TRITON_METRICS)",
        json_answer=False,
    ),
}
# Served but not an API: the catch-all that answers unknown /v1 paths with an error object.
UNDOCUMENTED = frozenset({"/v1/{path:path}"})


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorResponse(BaseModel):
    """OpenAI's error object."""

    error: OpenAIErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error object."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


class NativeErrorResponse(BaseModel):
    """The native APIs' error: what to fix."""

    error: str


ERROR_MODELS: dict[ErrorStyle, type[BaseModel]] = {
    ErrorStyle.OPENAI: OpenAIErrorResponse,
    ErrorStyle.ANTHROPIC: AnthropicErrorResponse,
    ErrorStyle.NATIVE: NativeErrorResponse,
}
_PARAMETER = re.compile(r"\{(\w+)(?::\w+)?\}")


def served_routes(mounts: Mounts) -> Iterator[tuple[str, str]]:
    """(path as Starlette spells it, method) of every route of the mounted apps, HEAD aside
    (Starlette adds it to every GET route)."""
    for app, prefix, _name in mounts:
        for route in getattr(app, "routes", ()):
            if not isinstance(route, Route) or route.methods is None:
                continue
            path = prefix.rstrip("/") + route.path
            for method in sorted(route.methods - {"HEAD"}):
                yield path, method


@dataclass(frozen=True, slots=True)
class Extras:
    """What the mounted apps add to BentoML's spec."""

    paths: dict[str, dict[str, Any]]
    schemas: dict[str, Any]
    tags: list[dict[str, str]]


def build_extras(mounts: Mounts) -> Extras:
    """The path items of every documented route of `mounts`, and the schemas they refer to."""
    served = [
        (path, method, OPERATIONS.get((path, method)))
        for path, method in served_routes(mounts)
        if path not in UNDOCUMENTED
    ]
    models = {op.body for _path, _method, op in served if op is not None and op.body is not None}
    models |= set(ERROR_MODELS.values())
    # All at once: pydantic gives distinct names to distinct models of the same name.
    refs, top = models_json_schema(
        [(model, "validation") for model in sorted(models, key=lambda m: m.__name__)],
        ref_template=REF_TEMPLATE,
    )
    paths: dict[str, dict[str, Any]] = {}
    tags: set[str] = set()
    for path, method, op in served:
        op = op or Operation(OPENAI if path.startswith("/v1/") else VLLM, f"{method} {path}")
        tags.add(op.tag)
        body_ref = refs[(op.body, "validation")] if op.body is not None else None
        error_ref = refs[(ERROR_MODELS[api_for(path).errors], "validation")]
        item = paths.setdefault(_PARAMETER.sub(r"{\1}", path), {})
        item[method.lower()] = _operation(path, method, op, body_ref, error_ref)
    tag_list = [{"name": name, "description": TAGS[name]} for name in TAGS if name in tags]
    return Extras(paths, top.get("$defs", {}), tag_list)


def _operation(
    path: str, method: str, op: Operation, body_ref: dict[str, Any] | None,
    error_ref: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    ok: dict[str, Any] = {"description": "OK"}
    if op.json_answer:
        ok["content"] = {"application/json": {"schema": {"type": "object"}}}
    if api_for(path).streams:
        ok["description"] = "OK: a JSON answer, or server-sent events with `stream: true`"
        ok.setdefault("content", {})["text/event-stream"] = {"schema": {"type": "string"}}
    operation: dict[str, Any] = {
        "tags": [op.tag],
        "summary": op.summary,
        "operationId": f"{method.lower()}_{re.sub(r'[^0-9A-Za-z]+', '_', path).strip('_')}",
        "responses": {
            "200": ok,
            "default": {
                "description": "An error",
                "content": {"application/json": {"schema": error_ref}},
            },
        },
    }
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PARAMETER.findall(path)
    ]
    if parameters:
        operation["parameters"] = parameters
    if body_ref is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body_ref}},
        }
    return operation


def merge(spec: dict[str, Any], extras: Extras) -> dict[str, Any]:
    """BentoML's spec with `extras` added (BentoML's own entries win a clash)."""
    paths = spec.setdefault("paths", {})
    for path, item in extras.paths.items():
        paths.setdefault(path, item)
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in extras.schemas.items():
        schemas.setdefault(name, schema)
    tags = spec.setdefault("tags", [])
    known = {tag.get("name") for tag in tags}
    tags.extend(tag for tag in extras.tags if tag["name"] not in known)
    return spec


class OpenAPIDocsMiddleware:
    """Adds the mounted apps' routes to BentoML's answer to `GET /docs.json`; every other
    request passes through after one comparison of its path."""

    def __init__(self, app: ASGIApp, mounts: Mounts) -> None:
        self.app = app
        # The service's live list: read at the first /docs.json, once every app is mounted.
        self.mounts = mounts
        self._extras: Extras | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("path") != DOCS_PATH or scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        await self._merged(scope, receive, send)

    @property
    def extras(self) -> Extras:
        if self._extras is None:
            self._extras = build_extras(self.mounts)
        return self._extras

    async def _merged(self, scope: Scope, receive: Receive, send: Send) -> None:
        start: Message | None = None
        chunks: list[bytes] = []

        async def hold(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and _mergeable(message):
                start = message
            elif message["type"] == "http.response.body" and start is not None:
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    body = self._with_extras(b"".join(chunks))
                    await send(_with_length(start, len(body)))
                    await send({"type": "http.response.body", "body": body})
            else:  # an error or an unexpected answer: BentoML's, as it is
                await send(message)

        await self.app(scope, receive, hold)

    def _with_extras(self, body: bytes) -> bytes:
        try:
            spec = json.loads(body)
        except ValueError:
            return body
        if not isinstance(spec, dict):
            return body
        merged = merge(spec, self.extras)
        # As Starlette's JSONResponse encodes it.
        return json.dumps(merged, ensure_ascii=False, separators=(",", ":")).encode()


def _mergeable(start: Message) -> bool:
    headers = dict(start.get("headers") or [])
    return (
        start.get("status") == 200
        and headers.get(b"content-type", b"").startswith(b"application/json")
        and b"content-encoding" not in headers
    )


def _with_length(start: Message, length: int) -> Message:
    headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
    return {**start, "headers": [*headers, (b"content-length", str(length).encode())]}
