"""Where the hf stand-in runs (device selection) and the demo model's sizes, checked on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tensorrtllm_backend.common.cpu_engine_config import (  # noqa: E402
    load_engine_config,
    write_engine_dir,
)
from tensorrtllm_backend.packing.demo import DEMO_SIZES, build_demo_checkpoint  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.hf import HFBackend, resolve_device  # noqa: E402


def test_auto_picks_cuda_only_when_torch_sees_a_gpu() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto") == expected
    assert resolve_device("cpu") == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_says_what_to_use() -> None:
    with pytest.raises(ValueError, match="use auto or cpu"):
        resolve_device("cuda")


def test_unknown_device_is_rejected() -> None:
    with pytest.raises(ValueError, match="choose auto, cpu or cuda"):
        resolve_device("tpu")


def test_engine_dir_keeps_the_device(tmp_path: Path) -> None:
    checkpoint = build_demo_checkpoint(tmp_path / "ckpt")
    engine = write_engine_dir(
        tmp_path / "engine", mode="hf", checkpoint_dir=checkpoint, vocab_size=2048,
        eos_token_id=2, device="cpu",
    )  # fmt: skip
    assert load_engine_config(engine).cpu_engine.device == "cpu"
    backend = HFBackend(load_engine_config(engine).checkpoint_path(), device="cpu")
    assert backend.device.type == "cpu"
    assert next(backend.model.parameters()).dtype == torch.float32


def test_device_defaults_to_auto_for_engine_dirs_written_before(tmp_path: Path) -> None:
    engine = write_engine_dir(tmp_path / "engine", mode="synthetic", vocab_size=64, eos_token_id=2)
    data = json.loads((engine / "config.json").read_text())
    del data["cpu_engine"]["device"]
    (engine / "config.json").write_text(json.dumps(data))
    assert load_engine_config(engine).cpu_engine.device == "auto"


def test_1b_demo_has_about_a_billion_weights() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=2048, **DEMO_SIZES["1b"])
    with torch.device("meta"):  # shapes only: nothing allocated
        model = LlamaForCausalLM(config)
    count = sum(p.numel() for p in model.parameters())
    assert 0.8e9 < count < 1.2e9


def test_unknown_demo_size_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tiny, awq, 1b"):
        build_demo_checkpoint(tmp_path / "ckpt", size="7b")
