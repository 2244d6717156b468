"""Fixtures of the packing tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_vlm_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo vision-language checkpoint (tokenizer + processor + tiny LLaVA), built once and
    read-only. Tests that need a variant copy it."""
    from tensorrtllm_backend.packing.demo import build_demo_vlm_checkpoint

    return build_demo_vlm_checkpoint(tmp_path_factory.mktemp("demo-vlm") / "checkpoint")
