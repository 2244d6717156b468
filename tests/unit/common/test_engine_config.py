"""engine.inspect_engine on engine directories laid out as trtllm-build writes them (>= 0.9 and the
legacy builder_config format), the CPU engine, and every way a directory can be unservable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_configs import modern_config

from tensorrtllm_backend.common.engine_config import (
    EngineConfigError,
    check_runtime_compatibility,
    inspect_engine,
    runtime_version_for_image,
)


def legacy_config() -> dict[str, Any]:
    """config.json as TensorRT-LLM < 0.9 (build.py) wrote it."""
    return {
        "builder_config": {
            "name": "llama",
            "precision": "float16",
            "tensor_parallel": 1,
            "pipeline_parallel": 1,
            "max_batch_size": 8,
            "max_input_len": 1024,
            "max_output_len": 512,
            "max_beam_width": 4,
            "vocab_size": 32000,
            "tensorrt_llm_version": "0.8.0",
        },
        "plugin_config": {"gpt_attention_plugin": "float16", "lora_plugin": False},
    }


def write_engine(path: Path, config: dict[str, Any] | str, files: list[str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(config)
    (path / "config.json").write_text(text)
    for name in files:
        (path / name).write_bytes(b"\0" * 16)
    return path


@pytest.fixture
def modern_dir(tmp_path: Path) -> Path:
    return write_engine(tmp_path / "engine", modern_config(), ["rank0.engine", "rank1.engine"])


def test_modern_engine_summary(modern_dir: Path) -> None:
    info = inspect_engine(modern_dir)
    assert info.kind == "tensorrt_llm"
    assert (info.version, info.architecture, info.dtype) == (
        "0.12.0",
        "LlamaForCausalLM",
        "float16",
    )
    assert info.vocab_size == 128256
    assert (info.tp_size, info.pp_size, info.world_size) == (2, 1, 2)
    assert (info.max_batch_size, info.max_input_len, info.max_seq_len) == (64, 2048, 4096)
    assert info.max_beam_width == 1 and info.max_num_tokens == 8192
    assert info.max_output_len == 4095
    assert info.engine_files == ["rank0.engine", "rank1.engine"]
    assert info.lora_enabled is False
    assert info.cpu_mode is None


def test_modern_engine_metadata_is_flat_json(modern_dir: Path) -> None:
    metadata = inspect_engine(modern_dir).metadata()
    assert metadata["world_size"] == 2
    assert metadata["engine_files"] == 2
    assert metadata["max_input_len"] == 2048
    assert "path" not in metadata and "cpu_mode" not in metadata  # None values dropped
    json.dumps(metadata)  # storable as BentoML model metadata


def test_lora_plugin_is_detected(tmp_path: Path) -> None:
    config = modern_config(plugin_config={"lora_plugin": "float16"})
    info = inspect_engine(write_engine(tmp_path, config, ["rank0.engine", "rank1.engine"]))
    assert info.lora_enabled is True


def test_v09_max_output_len_gives_max_seq_len(tmp_path: Path) -> None:
    config = modern_config()
    del config["build_config"]["max_seq_len"]
    config["build_config"]["max_output_len"] = 512
    info = inspect_engine(write_engine(tmp_path, config, ["rank0.engine", "rank1.engine"]))
    assert info.max_seq_len == 2048 + 512


def test_legacy_engine_summary(tmp_path: Path) -> None:
    engine_dir = write_engine(tmp_path, legacy_config(), ["llama_float16_tp1_rank0.engine"])
    info = inspect_engine(engine_dir)
    assert info.kind == "tensorrt_llm"
    assert (info.architecture, info.dtype, info.version) == ("llama", "float16", "0.8.0")
    assert info.world_size == 1
    assert (info.max_input_len, info.max_seq_len, info.max_beam_width) == (1024, 1536, 4)
    assert info.engine_files == ["llama_float16_tp1_rank0.engine"]


def test_legacy_tensor_parallel_needs_every_rank(tmp_path: Path) -> None:
    config = legacy_config()
    config["builder_config"]["tensor_parallel"] = 2
    engine_dir = write_engine(tmp_path, config, ["llama_float16_tp2_rank0.engine"])
    with pytest.raises(EngineConfigError, match=r"rank\(s\) \[1\]"):
        inspect_engine(engine_dir)
    (engine_dir / "llama_float16_tp2_rank1.engine").write_bytes(b"\0")
    assert inspect_engine(engine_dir).world_size == 2


def test_cpu_engine_needs_no_rank_files(tmp_path: Path) -> None:
    config = {
        "version": "cpu-engine-1",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "float32",
            "vocab_size": 2048,
            "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        },
        "build_config": {
            "max_batch_size": 64,
            "max_input_len": 1024,
            "max_seq_len": 1280,
            "max_beam_width": 1,
            "max_num_tokens": 8192,
        },
        "cpu_engine": {"mode": "synthetic", "ttft_ms": 0.0, "itl_ms": 0.0, "eos_token_id": 2},
    }
    info = inspect_engine(write_engine(tmp_path, config, []))
    assert (info.kind, info.cpu_mode, info.world_size) == ("cpu", "synthetic", 1)
    assert info.engine_files == []


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing_dir", "does not exist"),
        ("not_a_dir", "is not a directory"),
        ("no_config", "config.json is missing"),
        ("malformed", "not valid JSON"),
        ("not_an_object", "JSON object"),
        ("unknown_layout", "neither build_config"),
        ("no_engines", r"no \*\.engine files"),
        ("missing_rank", r"missing engine files for rank\(s\) \[1\]"),
        ("extra_rank", r"rank\(s\) \[2\] beyond world_size 2"),
        ("world_size_mismatch", "mapping.world_size is 4 but tp_size x pp_size = 2"),
        ("seq_not_above_input", r"max_seq_len \(2048\) must exceed max_input_len \(2048\)"),
        ("missing_limit", "build_config.max_batch_size is missing"),
        ("bad_limit", "build_config.max_input_len must be a positive integer"),
    ],
)
def test_unservable_engine_dirs(tmp_path: Path, setup: str, message: str) -> None:
    engine_dir = tmp_path / "engine"
    ranks = ["rank0.engine", "rank1.engine"]
    config = modern_config()
    if setup == "missing_dir":
        pass
    elif setup == "not_a_dir":
        engine_dir.write_text("a file")
    elif setup == "no_config":
        engine_dir.mkdir()
        for name in ranks:
            (engine_dir / name).write_bytes(b"\0")
    elif setup == "malformed":
        write_engine(engine_dir, '{"version": "0.12.0", ', ranks)
    elif setup == "not_an_object":
        write_engine(engine_dir, "[1, 2]", ranks)
    elif setup == "unknown_layout":
        write_engine(engine_dir, {"version": "0.12.0"}, ranks)
    elif setup == "no_engines":
        write_engine(engine_dir, config, [])
    elif setup == "missing_rank":
        write_engine(engine_dir, config, ["rank0.engine"])
    elif setup == "extra_rank":
        write_engine(engine_dir, config, [*ranks, "rank2.engine"])
    elif setup == "world_size_mismatch":
        config["pretrained_config"]["mapping"]["world_size"] = 4
        write_engine(engine_dir, config, ranks)
    elif setup == "seq_not_above_input":
        config["build_config"]["max_seq_len"] = 2048
        write_engine(engine_dir, config, ranks)
    elif setup == "missing_limit":
        del config["build_config"]["max_batch_size"]
        write_engine(engine_dir, config, ranks)
    elif setup == "bad_limit":
        config["build_config"]["max_input_len"] = 0
        write_engine(engine_dir, config, ranks)
    with pytest.raises(EngineConfigError, match=message):
        inspect_engine(engine_dir)


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("nvcr.io/nvidia/tritonserver:24.03-trtllm-python-py3", "0.8.0"),
        ("nvcr.io/nvidia/tritonserver:24.08-trtllm-python-py3", "0.12.0"),
        ("nvcr.io/nvidia/tritonserver:25.03-trtllm-python-py3", "0.18.0"),
        ("nvcr.io/nvidia/tritonserver:99.01-trtllm-python-py3", None),  # unknown release
        ("nvcr.io/nvidia/tritonserver:24.08-py3", None),  # no TensorRT-LLM backend
        ("python:3.11-slim", None),
    ],
)
def test_runtime_version_for_image(image: str, version: str | None) -> None:
    assert runtime_version_for_image(image) == version


def test_version_mismatch_is_rejected(modern_dir: Path) -> None:
    info = inspect_engine(modern_dir)
    runtime = runtime_version_for_image("nvcr.io/nvidia/tritonserver:24.03-trtllm-python-py3")
    with pytest.raises(
        EngineConfigError, match=r"built by TensorRT-LLM 0\.12\.0 .* runs TensorRT-LLM 0\.8\.0"
    ):
        check_runtime_compatibility(info, runtime)


def test_same_release_and_unknown_runtime_are_accepted(modern_dir: Path) -> None:
    info = inspect_engine(modern_dir)
    check_runtime_compatibility(info, "0.12.1")  # patch releases share the engine format
    check_runtime_compatibility(info, None)  # unknown image: nothing to check against
    assert info.version == "0.12.0"


def test_cpu_engine_skips_the_version_check(tmp_path: Path) -> None:
    config = modern_config()
    config["version"] = "cpu-engine-1"
    config["pretrained_config"]["mapping"] = {"world_size": 1, "tp_size": 1, "pp_size": 1}
    config["cpu_engine"] = {"mode": "synthetic"}
    info = inspect_engine(write_engine(tmp_path, config, []))
    check_runtime_compatibility(info, "0.8.0")
    assert info.kind == "cpu"


def test_the_kv_cache_block_size_is_read_from_the_plugins(tmp_path: Path) -> None:
    plugins = {**modern_config()["build_config"]["plugin_config"], "tokens_per_block": 64}
    info = inspect_engine(
        write_engine(
            tmp_path, modern_config(plugin_config=plugins), ["rank0.engine", "rank1.engine"]
        )
    )
    assert info.tokens_per_block == 64
