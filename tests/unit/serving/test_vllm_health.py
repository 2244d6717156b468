"""vLLM's `GET /health` in the root app the service mounts: 200 with an empty body while the
replica serves, 503 with the reason otherwise, and open to probes when an API key guards the
rest (routers poll it without the key). tests/integration/test_router.py has vllm-router wait on
it in front of real replicas."""

from __future__ import annotations

from starlette.testclient import TestClient

from tensorrtllm_backend.serving.api_surface import root_app
from tensorrtllm_backend.serving.guard import GuardMiddleware
from tensorrtllm_backend.settings import Settings


class Replica:
    """What /health reads: why the replica cannot serve, changed by the test."""

    def __init__(self) -> None:
        self.reason: str | None = "the model server is starting"

    def not_ready(self) -> str | None:
        return self.reason


def test_health_follows_the_replicas_readiness() -> None:
    replica = Replica()
    http = TestClient(root_app(lambda: None, replica.not_ready))
    starting = http.get("/health")
    assert starting.status_code == 503
    assert starting.json() == {"error": "the model server is starting"}

    replica.reason = None
    serving = http.get("/health")
    assert serving.status_code == 200 and serving.content == b""  # vLLM's answer: no body
    assert http.head("/health").status_code == 200

    replica.reason = "the model server is restarting (it stopped answering)"
    assert http.get("/health").status_code == 503
    assert http.post("/health").status_code == 405


def test_health_needs_no_api_key() -> None:
    app = root_app(lambda: None, lambda: None)
    http = TestClient(GuardMiddleware(app, Settings(api_key="s3cret")))  # type: ignore[arg-type]
    assert http.get("/health").status_code == 200
    assert http.post("/tokenize", json={"prompt": "hi"}).status_code == 401  # the rest: guarded


def test_the_service_is_not_healthy_before_it_exists() -> None:
    """Outside a running service (no instance yet), /health must not claim it serves."""
    import service

    assert service._not_ready_reason() == "the model server is starting"
