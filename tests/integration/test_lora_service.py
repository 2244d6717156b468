"""LoRA adapters through the real service: listed by /v1/models, selected by name, and a clear
answer on the CPU engine, which does not apply them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import BentoServer, pack
from tests.lora_helpers import write_adapter

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    adapter = write_adapter(tmp_path_factory.mktemp("adapters") / "sql")
    return pack("--synthetic", "--name", "trtllm-lora", "--lora", f"sql={adapter}")


def test_adapters_are_listed_and_selected_by_name(
    lora_model: str, bento_server_factory: Callable[..., BentoServer], tmp_path: Path
) -> None:
    server = bento_server_factory(lora_model)
    models = httpx.get(f"{server.url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["trtllm-lora", "sql"]

    native = httpx.post(
        f"{server.url}/generate_text",
        json={"prompt": "hello", "max_tokens": 4, "lora": "sql"},
        timeout=30,
    )
    assert native.status_code == 400
    assert "LoRA adapters need TensorRT-LLM" in native.text

    unknown = httpx.post(
        f"{server.url}/generate_text",
        json={"prompt": "hello", "max_tokens": 4, "lora": "nope"},
        timeout=30,
    )
    assert unknown.status_code == 404 and "this model has: sql" in unknown.text

    openai_adapter = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": "sql", "prompt": "hello", "max_tokens": 4},
        timeout=30,
    )
    assert openai_adapter.status_code == 400
    assert openai_adapter.json()["error"]["param"] == "lora"

    base = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": "trtllm-lora", "prompt": "hello", "max_tokens": 4},
        timeout=30,
    )
    assert base.status_code == 200 and base.json()["usage"]["completion_tokens"] == 4
