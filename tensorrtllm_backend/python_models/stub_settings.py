"""The `TRTLLM_*` variables read inside Triton's python stubs (the service's are in settings.py).

The stubs are processes of their own, started by tritonserver with the environment the
supervisor gave it; they read these when a model loads. (`TRTLLM_BACKEND_PYTHONPATH` is read by
each model.py before this package can be imported there.)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..common.media import MediaLimits

ORPHAN_GRACE_ENV = "TRTLLM_CPU_ENGINE_ORPHAN_GRACE_S"
LLMAPI_IMPL_ENV = "TRTLLM_LLMAPI_IMPL"
LLMAPI_MODEL_PY_ENV = "TRTLLM_LLMAPI_MODEL_PY"
NGC_LLMAPI_MODEL_PY = "/app/all_models/llmapi/tensorrt_llm/1/model.py"
LLMAPI_IMPLS = ("auto", "tensorrt_llm", "cpu")
# NVIDIA's variable (theirs, not a TRTLLM_ one): another model.yaml (an absolute path wins),
# read by their model and ours.
NVIDIA_LLM_CONFIG_PATH = "LLM_CONFIG_PATH"
KV_EVENTS_ENDPOINT_ENV = "TRTLLM_KV_EVENTS_ENDPOINT"
KV_EVENTS_REPLAY_ENDPOINT_ENV = "TRTLLM_KV_EVENTS_REPLAY_ENDPOINT"
KV_EVENTS_TOPIC_ENV = "TRTLLM_KV_EVENTS_TOPIC"
# tcp://HOST:PORT, HOST a name, an IPv4 address, [an IPv6 address] or * (every interface).
_TCP_BIND = re.compile(r"tcp://(\*|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")


def cpu_engine_grace_s() -> float:
    """How long a CPU engine's stub may take to exit by itself once tritonserver is gone (tests
    shorten it)."""
    return float(os.environ.get(ORPHAN_GRACE_ENV) or 10)


def llmapi_impl() -> str:
    """The engine behind the llmapi model: tensorrt_llm (the LLM API), cpu (the CPU stand-in),
    or auto (tensorrt_llm where it is importable)."""
    choice = os.environ.get(LLMAPI_IMPL_ENV, "").strip().lower() or "auto"
    if choice not in LLMAPI_IMPLS:
        *others, last = LLMAPI_IMPLS
        raise RuntimeError(f"{LLMAPI_IMPL_ENV}={choice!r}: use {', '.join(others)} or {last}")
    return choice


def llmapi_model_py() -> str:
    """Where NVIDIA's llmapi model.py is: $TRTLLM_LLMAPI_MODEL_PY, else the NGC image's."""
    return os.environ.get(LLMAPI_MODEL_PY_ENV) or NGC_LLMAPI_MODEL_PY


def llm_config_path() -> str | None:
    """$LLM_CONFIG_PATH: the model.yaml to read instead of 1/model.yaml."""
    return os.environ.get(NVIDIA_LLM_CONFIG_PATH) or None


@dataclass(frozen=True)
class KvEventsSettings:
    """Where the engine publishes its KV-cache events (python_models/kv_events.py)."""

    endpoint: str
    replay_endpoint: str | None
    topic: str


def kv_events_settings() -> KvEventsSettings | None:
    """$TRTLLM_KV_EVENTS_*: None (no events) unless TRTLLM_KV_EVENTS_ENDPOINT is set."""
    endpoint = _bind_address(KV_EVENTS_ENDPOINT_ENV)
    replay = _bind_address(KV_EVENTS_REPLAY_ENDPOINT_ENV)
    if endpoint is None:
        if replay is not None:
            raise RuntimeError(f"{KV_EVENTS_REPLAY_ENDPOINT_ENV} needs {KV_EVENTS_ENDPOINT_ENV}")
        return None
    return KvEventsSettings(endpoint, replay, os.environ.get(KV_EVENTS_TOPIC_ENV, ""))


def _bind_address(name: str) -> str | None:
    """A bind address: tcp://HOST:PORT as given, or a bare port on loopback (a host that other
    machines reach is the user's choice, never a default)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    address = f"tcp://127.0.0.1:{value}" if value.isdigit() else value
    match = _TCP_BIND.fullmatch(address)
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        raise RuntimeError(f"{name}={value!r}: use tcp://HOST:PORT, or a port (on 127.0.0.1)")
    return address


def media_limits() -> MediaLimits:
    """The image bounds the engine side decodes within: the service's own variables
    (TRTLLM_MAX_IMAGE_BYTES, TRTLLM_MAX_IMAGE_PIXELS, TRTLLM_MAX_IMAGES_PER_REQUEST, and for
    NVIDIA's image_url input TRTLLM_ALLOWED_MEDIA_DOMAINS, TRTLLM_MEDIA_FETCH_TIMEOUT_S), so
    an image the service accepted is never refused here; defaults where unset."""
    default = MediaLimits()
    domains = os.environ.get("TRTLLM_ALLOWED_MEDIA_DOMAINS", "").split(",")
    return MediaLimits(
        max_image_bytes=_positive("TRTLLM_MAX_IMAGE_BYTES", default.max_image_bytes),
        max_request_image_bytes=_positive(
            "TRTLLM_MAX_REQUEST_IMAGE_BYTES", default.max_request_image_bytes
        ),
        max_image_pixels=_positive("TRTLLM_MAX_IMAGE_PIXELS", default.max_image_pixels),
        max_images=_positive("TRTLLM_MAX_IMAGES_PER_REQUEST", default.max_images),
        fetch_timeout_s=float(
            os.environ.get("TRTLLM_MEDIA_FETCH_TIMEOUT_S") or default.fetch_timeout_s
        ),
        allowed_domains=tuple(d.strip().lower() for d in domains if d.strip()),
    )


def _positive(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise RuntimeError(f"{name}={value!r}: a positive integer is expected")
    return int(value)
