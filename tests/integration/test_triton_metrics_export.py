"""Triton's own metrics re-exported on the BentoML port when asked for, and only then."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.integration.conftest import BentoServer

pytestmark = pytest.mark.integration


def test_triton_metrics_are_relayed_when_enabled(
    synthetic_model: str, bento_server_factory: Callable[..., BentoServer]
) -> None:
    server = bento_server_factory(synthetic_model, env={"TRTLLM_EXPORT_TRITON_METRICS": "1"})
    generated = httpx.post(
        f"{server.url}/generate_text", json={"prompt": "hello", "max_tokens": 3}, timeout=30
    )
    assert generated.status_code == 200
    relayed = httpx.get(f"{server.url}/triton/metrics", timeout=10)
    assert relayed.status_code == 200
    assert "nv_inference_request_success" in relayed.text  # Triton's own
    assert "trtllm_cpu_engine_generated_tokens_total" in relayed.text  # the engine's


def test_triton_metrics_are_not_exposed_by_default(demo_server: BentoServer) -> None:
    assert httpx.get(f"{demo_server.url}/triton/metrics", timeout=10).status_code == 404
