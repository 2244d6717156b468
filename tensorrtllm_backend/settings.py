"""Every `TRTLLM_*` environment variable of the service and of pack_model.py, typed, read here.

One rule for all of them: an empty value means "not set"; booleans are pydantic's
(`1/true/yes/on`, `0/false/no/off`, any case); anything that does not parse stops the start with
a message naming the variable. The table in docs/configuration.md is checked against
:class:`Settings` and :data:`STUB_VARIABLES` by a test, so a variable cannot go undocumented.

Read the environment when a value is needed (:func:`load_settings`), not at import: `bentoml
serve` sets the shared Triton ports before it starts its workers, and tests change variables.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

PREFIX = "TRTLLM_"

# Names the service also writes, for the processes it starts (workers, tritonserver's stubs).
GRPC_PORT_ENV = "TRTLLM_TRITON_GRPC_PORT"
HTTP_PORT_ENV = "TRTLLM_TRITON_HTTP_PORT"
METRICS_PORT_ENV = "TRTLLM_TRITON_METRICS_PORT"
PORT_ENVS = (GRPC_PORT_ENV, HTTP_PORT_ENV, METRICS_PORT_ENV)
SHARED_DIR_ENV = "TRTLLM_SHARED_DIR"
BACKEND_PYTHONPATH_ENV = "TRTLLM_BACKEND_PYTHONPATH"

# Read inside Triton's python stubs (another process), in python_models/stub_settings.py, and
# TRTLLM_BACKEND_PYTHONPATH by each model.py before our package can be imported there; the
# supervisor passes the environment on.
STUB_VARIABLES = (
    BACKEND_PYTHONPATH_ENV,
    "TRTLLM_CPU_ENGINE_ORPHAN_GRACE_S",
    "TRTLLM_LLMAPI_IMPL",
    "TRTLLM_LLMAPI_MODEL_PY",
    "TRTLLM_KV_EVENTS_ENDPOINT",
    "TRTLLM_KV_EVENTS_REPLAY_ENDPOINT",
    "TRTLLM_KV_EVENTS_TOPIC",
)

RouteName = Literal["direct", "ensemble", "bls", "llmapi"]
TCPPort = Field(None, ge=1, le=65535)


CORES_PER_WORKER = 4
MAX_DEFAULT_WORKERS = 8


def host_workers() -> int:
    """TRTLLM_WORKERS' default: a worker per CORES_PER_WORKER cores this process may run on,
    1 to MAX_DEFAULT_WORKERS. One HTTP worker's event loop holds back the time to first token
    under load on a many-core host (+58 ms at ITL 20 ms, C=128 on 16 cores, against +2 to +5 ms
    with four: docs/performance.md); on two cores a second worker only competes for them."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_DEFAULT_WORKERS, cores // CORES_PER_WORKER))


class Settings(BaseSettings):
    """The service's configuration (docs/configuration.md describes each)."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_ignore_empty=True, extra="ignore", frozen=True
    )

    # What is served, and how.
    model: str | None = None
    route: RouteName | None = None
    served_model_name: str | None = None
    # Names in the chat core's registries (serving/chat: tool_parsers.FORMATS,
    # reasoning.REASONING_FORMATS, or "none"), checked there when the service starts.
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    # The Responses API's stored responses (per worker): their total size and age.
    responses_store_bytes: int = Field(64 * 1024 * 1024, ge=0)
    responses_store_ttl_s: float = Field(3600.0, ge=0.0)
    # The Responses API's tools that run on OpenAI's side (web_search...): left out of what the
    # model is offered, with a log line, or refused with a 400.
    hosted_tools: Literal["omit", "reject"] = "omit"
    # /v1/completions: whether a text prompt gets the tokenizer's special tokens (BOS), as
    # vLLM's add_special_tokens; a request's own field wins.
    completions_add_special_tokens: bool = True
    # The key that seals reasoning items for stateless clients (32 bytes, base64); without one,
    # `bentoml serve` makes one per start (serving/responses_api/sealing.py).
    reasoning_key: SecretStr | None = None

    # tritonserver.
    triton_grpc_port: int | None = TCPPort
    triton_http_port: int | None = TCPPort
    triton_metrics_port: int | None = TCPPort
    tritonserver: Path | None = None
    triton_backend_dir: Path | None = None
    startup_timeout_s: PositiveFloat = 600.0
    stall_timeout_s: float = Field(120.0, ge=0.0)
    engine_instances: PositiveInt | None = None

    # HTTP workers, their limits and BentoML's traffic settings.
    workers: PositiveInt = Field(default_factory=host_workers)
    shared_dir: Path | None = None
    rebalance_connections: bool = True
    stream_interval: PositiveInt = 1
    api_key: SecretStr | None = None
    max_in_flight: PositiveInt = 1024
    max_request_bytes: PositiveInt = 4 * 1024 * 1024
    # Images in (a model that takes them): per request, per image, and where they may come from
    # (comma-separated host names; unset: data: URIs only, no fetching).
    allowed_media_domains: str | None = None
    max_images_per_request: PositiveInt = 8
    max_image_bytes: PositiveInt = 10 * 1024 * 1024
    max_request_image_bytes: PositiveInt = 32 * 1024 * 1024
    max_image_pixels: PositiveInt = 16_000_000
    media_fetch_timeout_s: PositiveFloat = 10.0
    max_media_redirects: int = Field(3, ge=0)
    guide_compile_timeout_s: PositiveFloat = 10.0
    http_keepalive_s: PositiveInt = 75
    concurrency: PositiveInt | None = None
    external_queue: bool = False

    # Observability.
    log_requests: bool = True
    export_triton_metrics: bool = False
    trace_streams: bool = False

    # Deployment: `bentoml build` and pack_model.py.
    gpu_type: str | None = None
    base_image: str | None = None


def env_name(field: str) -> str:
    return PREFIX + field.upper()


def load_settings() -> Settings:
    """The settings as the environment has them now; a bad value is a ValueError naming it."""
    try:
        return Settings()
    except ValidationError as error:
        problems = []
        for item in error.errors():
            name = env_name(str(item["loc"][0])) if item["loc"] else "TRTLLM_*"
            problems.append(f"{name}={item.get('input')!r}: {item['msg']}")
        raise ValueError("; ".join(problems)) from None
