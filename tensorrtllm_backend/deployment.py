"""Deployment-time choices made when service.py is imported: which stored model to serve and
what resources to ask BentoML / BentoCloud for."""

from __future__ import annotations

import os
from typing import Any

import bentoml

from .packing import FORMAT

DEFAULT_MODEL = "trtllm-demo:latest"


def model_tag() -> str:
    """$TRTLLM_MODEL; else the only packed model in the store (as inside a built Bento); else
    the demo model."""
    explicit = os.environ.get("TRTLLM_MODEL")
    if explicit:
        return explicit
    names = {
        model.tag.name
        for model in bentoml.models.list()
        if model.info.metadata.get("format") == FORMAT
    }
    return f"{names.pop()}:latest" if len(names) == 1 else DEFAULT_MODEL


def resources(tag: str) -> dict[str, Any]:
    """One GPU per rank for TensorRT-LLM engines; the CPU engine needs none."""
    try:
        metadata = bentoml.models.get(tag).info.metadata
    except bentoml.exceptions.NotFound:
        return {"cpu": "2"}
    if metadata.get("engine_kind") == "cpu":
        return {"cpu": "2"}
    requested: dict[str, Any] = {"gpu": int(metadata.get("engine_world_size", 1))}
    if os.environ.get("TRTLLM_GPU_TYPE"):  # BentoCloud names, e.g. nvidia-l4, nvidia-a100-80gb
        requested["gpu_type"] = os.environ["TRTLLM_GPU_TYPE"]
    return requested


STREAMING_PATHS = ["/generate$", "/v1/completions$", "/v1/chat/completions$"]


def tracing_config() -> dict[str, Any]:
    """OpenTelemetry's ASGI middleware opens a span for every HTTP body message, i.e. per streamed
    chunk: that costs ~10% of the serving CPU. Streaming paths are left out of tracing unless
    TRTLLM_TRACE_STREAMS=1."""
    if os.environ.get("TRTLLM_TRACE_STREAMS", "").lower() in ("1", "true", "yes"):
        return {}
    return {"excluded_urls": STREAMING_PATHS}
