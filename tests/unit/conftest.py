"""Fixtures every unit-test folder may use."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo Hugging Face checkpoint (tokenizer + tiny Llama), built once and read-only: it
    doubles as a tokenizer dir. Tests that need a variant copy it."""
    from tensorrtllm_backend.packing.demo import build_demo_checkpoint

    return build_demo_checkpoint(tmp_path_factory.mktemp("demo") / "checkpoint")


@pytest.fixture(scope="session")
def demo_tokenizer(demo_checkpoint: Path):
    """The demo checkpoint's tokenizer, loaded as every process of the service loads it."""
    from tensorrtllm_backend.common.tokenization import load_tokenizer

    return load_tokenizer(demo_checkpoint)
