"""The guard's API key as OpenAI clients send it (Authorization: Bearer) and as Anthropic's do
(x-api-key); a refusal in the error shape of the API asked (Anthropic's under /v1/messages)."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from tensorrtllm_backend.serving.guard import GuardMiddleware
from tensorrtllm_backend.settings import Settings

KEY = "s3cret"


async def ok(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


@pytest.fixture
def client() -> TestClient:
    app = Starlette(
        routes=[Route(path, ok, methods=["POST"]) for path in ("/v1/messages", "/v1/responses")]
    )
    settings = Settings(api_key=KEY)
    return TestClient(GuardMiddleware(app, settings))  # type: ignore[arg-type]


def test_a_bearer_token_or_an_x_api_key_is_the_key(client: TestClient) -> None:
    assert client.post("/v1/responses", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert client.post("/v1/messages", headers={"x-api-key": KEY}).json() == {"ok": True}
    assert client.post("/v1/responses", headers={"x-api-key": KEY}).status_code == 200


@pytest.mark.parametrize("headers", [{}, {"x-api-key": "wrong"}, {"Authorization": KEY}])
def test_anything_else_is_refused_in_the_apis_error_shape(
    client: TestClient, headers: dict[str, str]
) -> None:
    anthropic = client.post("/v1/messages", headers=headers)
    assert anthropic.status_code == 401
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "authentication_error"
    assert "x-api-key" in anthropic.json()["error"]["message"]
    openai = client.post("/v1/responses", headers=headers)
    assert openai.status_code == 401 and openai.json()["error"]["type"] == "authentication_error"
