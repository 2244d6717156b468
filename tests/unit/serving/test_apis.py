"""The registry of APIs (serving/apis.py): every route the service serves is in it, and the
guard, the error handling and the deployment read their lists from it."""

from __future__ import annotations

from tensorrtllm_backend.serving.apis import APIS, UNLISTED, ErrorStyle, api_for, streaming_paths
from tensorrtllm_backend.serving.deployment import tracing_config


def served_paths() -> set[str]:
    """The paths service.py serves: its BentoML APIs and the routes of the apps it mounts."""
    import service

    paths = {api.route for api in service.TRTLLM.apis.values()}
    for app, prefix, _name in service.TRTLLM.mount_apps:
        paths |= {prefix.rstrip("/") + route.path for route in app.routes}
    return paths


def test_every_served_path_is_registered() -> None:
    """An API missing from the registry would skip the in-flight bound and the right errors."""
    registered = {api.path for api in APIS}
    missing = served_paths() - registered
    assert not missing, f"add these to serving/apis.py: {sorted(missing)}"


def test_generation_apis_have_a_metrics_label_and_are_not_open() -> None:
    generation = [api for api in APIS if api.generation]
    assert {api.path for api in generation} == {
        "/generate", "/generate_text", "/v1/completions", "/v1/chat/completions",
        "/v1/responses", "/v1/messages",
    }  # fmt: skip
    assert all(api.metrics_label and not api.open for api in generation)
    assert api_for("/v1/chat/completions").errors is ErrorStyle.OPENAI
    assert api_for("/generate_text").errors is ErrorStyle.NATIVE
    assert api_for("/v1/messages").errors is ErrorStyle.ANTHROPIC


def test_unlisted_paths_get_the_strict_default() -> None:
    unlisted = api_for("/no/such/api")
    assert unlisted is UNLISTED and not unlisted.open and not unlisted.generation
    assert api_for("/v1/embeddings").errors is ErrorStyle.OPENAI  # /v1 answers OpenAI errors
    assert api_for("/v1/responses/resp_1/cancel").errors is ErrorStyle.OPENAI
    assert api_for("/v1/messages/batches").errors is ErrorStyle.ANTHROPIC
    assert api_for("/readyz").open and api_for("/metrics").open


def test_streaming_apis_are_left_out_of_tracing(monkeypatch) -> None:
    monkeypatch.delenv("TRTLLM_TRACE_STREAMS", raising=False)
    excluded = tracing_config()["excluded_urls"]
    assert excluded == streaming_paths()
    assert set(excluded) == {
        "/generate$", "/v1/completions$", "/v1/chat/completions$", "/v1/responses$",
        "/v1/messages$",
    }  # fmt: skip
    monkeypatch.setenv("TRTLLM_TRACE_STREAMS", "1")
    assert tracing_config() == {}
