# ruff: noqa: F811  (fixtures shared with test_pack_model are imported, then requested)
"""Quantized models at pack time: what ModelOpt, Hugging Face and trtllm-build write is read and
recorded; a GPU that cannot run the format, and the CPU stand-in, refuse it before anything is
stored (the stand-in would read packed weights as plain floats and answer wrong text)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from engine_configs import modern_config
from test_llmapi_pack import checkpoint, make_checkpoint  # noqa: F401
from test_pack_model import name, run_pack, unchanged_store, write_engine_dir  # noqa: F401

from tensorrtllm_backend.common.engine_config import inspect_engine
from tensorrtllm_backend.common.quantization import (
    Quantization,
    from_checkpoint,
    from_engine_config,
    gpu_refusal,
)

MODELOPT_FP8 = {
    "producer": {"name": "modelopt", "version": "0.47.0"},
    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
}
MODELOPT_NVFP4 = {"quantization": {"quant_algo": "NVFP4", "group_size": 16}}


def with_config(directory: Path, **config: object) -> Path:
    data = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**data, **config}))
    return directory


def test_modelopts_unified_checkpoint_is_read(checkpoint: Path) -> None:
    (checkpoint / "hf_quant_config.json").write_text(json.dumps(MODELOPT_FP8))
    assert from_checkpoint(checkpoint) == Quantization(
        algorithm="FP8", kv_cache="FP8", source="hf_quant_config.json"
    )


@pytest.mark.parametrize(
    ("config", "algorithm", "group"),
    [
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, "W4A16_AWQ", 128),
        ({"quant_method": "gptq", "bits": 4, "group_size": 64}, "W4A16_GPTQ", 64),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "FP8", None),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, "NVFP4", 16),
        ({"quant_method": "compressed-tensors", "config_groups": {}}, "compressed-tensors", None),
    ],
)
def test_hugging_faces_quantization_config_is_read(
    checkpoint: Path, config: dict, algorithm: str, group: int | None
) -> None:
    found = from_checkpoint(with_config(checkpoint, quantization_config=config))
    assert found is not None and (found.algorithm, found.group_size) == (algorithm, group)
    assert found.source.startswith("config.json quantization_config")


def test_a_full_precision_checkpoint_has_none(checkpoint: Path) -> None:
    assert from_checkpoint(checkpoint) is None


def test_an_int4_awq_engine_is_recorded_as_such(tmp_path: Path) -> None:
    """What trtllm-build writes for --use_weight_only --weight_only_precision int4_awq."""
    config = modern_config()
    config["pretrained_config"]["quantization"] = {
        "quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None, "group_size": 128,
    }  # fmt: skip
    engine = write_engine_dir(tmp_path / "engine", config)
    info = inspect_engine(engine)
    assert info.quantization == from_engine_config(config)
    assert info.quantization is not None
    assert info.quantization.describe() == "W4A16_AWQ, group size 128 (engine config.json)"
    assert info.metadata()["quantization"]["algorithm"] == "W4A16_AWQ"


def test_a_format_the_gpu_cannot_run_is_named_with_the_gpus_that_can() -> None:
    nvfp4 = Quantization(algorithm="NVFP4", group_size=16, source="hf_quant_config.json")
    refusal = gpu_refusal(nvfp4, "nvidia-h100-80gb")
    assert refusal is not None and "Blackwell" in refusal and "nvidia-h100-80gb" in refusal
    assert gpu_refusal(nvfp4, "nvidia-b200") is None
    fp8 = Quantization(algorithm="FP8", source="hf_quant_config.json")
    assert gpu_refusal(fp8, "nvidia-l4") is None
    assert "Hopper" in (gpu_refusal(fp8, "nvidia-a100-80gb") or "")
    assert gpu_refusal(fp8, "a-gpu-not-in-the-table") is None  # unknown: not refused


def test_an_nvfp4_checkpoint_for_a_hopper_target_is_refused_at_pack_time(
    checkpoint: Path, name: str, unchanged_store, capsys
) -> None:
    (checkpoint / "hf_quant_config.json").write_text(json.dumps(MODELOPT_NVFP4))
    args = ("--checkpoint", str(checkpoint), "--name", name, "--gpu-type", "nvidia-h100-80gb")
    assert run_pack(*args) == 2
    assert "NVFP4 needs a GPU of compute capability 10.0" in capsys.readouterr().err
    assert run_pack(*args[:-1], "nvidia-b200", "--dry-run") == 0
    assert "quantization: NVFP4, group size 16 (hf_quant_config.json)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("hf_quant_config", "quantization_config", "message"),
    [
        (MODELOPT_NVFP4, None, "NVFP4 fake quantization runs on CUDA only"),
        (None, {"quant_method": "awq", "bits": 4}, "ModelOpt's unified checkpoints only"),
        (MODELOPT_FP8, None, "no layer has a weight_scale"),  # FP8 said, float weights stored
    ],
)
def test_the_cpu_stand_in_refuses_what_it_cannot_dequantize(
    checkpoint: Path, name: str, unchanged_store, capsys, tmp_path: Path,
    hf_quant_config: dict | None, quantization_config: dict | None, message: str,
) -> None:  # fmt: skip
    """It dequantizes ModelOpt's FP8 and INT4 / W4A8 AWQ checkpoints (test_quantize.py,
    python_models/test_cpu_engine_quantized.py); anything else would answer wrong text."""
    quantized = shutil.copytree(checkpoint, tmp_path / "quantized")
    if hf_quant_config is not None:
        (quantized / "hf_quant_config.json").write_text(json.dumps(hf_quant_config))
    if quantization_config is not None:
        with_config(quantized, quantization_config=quantization_config)
    assert run_pack("--hf-model", str(quantized), "--name", name) == 2
    assert message in capsys.readouterr().err
