"""CPU engine directory format: a TensorRT-LLM-like config.json plus a `cpu_engine` section.

The layout mirrors a real TensorRT-LLM engine's config.json so one reader (engine.py) serves both;
the extra `cpu_engine` section tells the CPU stand-in how to produce tokens.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ENGINE_VERSION = "cpu-engine-1"
CHECKPOINT_SUBDIR = "checkpoint"


class Mapping(BaseModel):
    """Parallelism layout; the CPU engine always runs as one rank."""

    model_config = ConfigDict(extra="allow")
    world_size: int = 1
    tp_size: int = 1
    pp_size: int = 1


class PretrainedConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    architecture: str = "LlamaForCausalLM"
    dtype: str = "float32"
    vocab_size: int = Field(gt=0)
    mapping: Mapping = Field(default_factory=Mapping)


class PluginConfig(BaseModel):
    """The KV cache's block size, where trtllm-build writes it."""

    model_config = ConfigDict(extra="allow")
    tokens_per_block: int = Field(default=32, gt=0)  # trtllm-build's default


class BuildConfig(BaseModel):
    """Engine limits that requests are validated against (as TensorRT-LLM does)."""

    model_config = ConfigDict(extra="allow")
    plugin_config: PluginConfig = Field(default_factory=PluginConfig)
    max_batch_size: int = Field(default=64, gt=0)
    max_input_len: int = Field(default=1024, gt=0)
    max_seq_len: int = Field(default=1280, gt=0)
    max_beam_width: int = Field(default=1, gt=0)
    max_num_tokens: int = Field(default=8192, gt=0)

    @model_validator(mode="after")
    def _seq_covers_input(self) -> BuildConfig:
        if self.max_seq_len < self.max_input_len:
            raise ValueError("max_seq_len must be >= max_input_len")
        return self


class CpuEngineSection(BaseModel):
    """How the stand-in produces tokens: a real HF checkpoint, a deterministic synthetic stream,
    or a script played through the packed chat template's tool-call format (for agent clients)."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["hf", "synthetic", "scripted"]
    # hf: the checkpoint; scripted: the tokenizer it reads the conversation and writes with.
    checkpoint_dir: str | None = None
    ttft_ms: float = Field(default=0.0, ge=0)
    itl_ms: float = Field(default=0.0, ge=0)
    eos_token_id: int = 2
    seed: int = 0
    # hf mode: where the transformers model runs; auto picks CUDA when torch sees a GPU.
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @model_validator(mode="after")
    def _hf_needs_checkpoint(self) -> CpuEngineSection:
        if self.mode in ("hf", "scripted") and not self.checkpoint_dir:
            raise ValueError(f"cpu_engine.mode {self.mode!r} needs cpu_engine.checkpoint_dir")
        return self


class EngineConfig(BaseModel):
    """Parsed <engine_dir>/config.json; `engine_dir` is filled in by load_engine_config."""

    model_config = ConfigDict(extra="allow")
    version: str = ENGINE_VERSION
    pretrained_config: PretrainedConfig
    build_config: BuildConfig = Field(default_factory=BuildConfig)
    cpu_engine: CpuEngineSection
    engine_dir: Path | None = Field(default=None, exclude=True)

    def checkpoint_path(self) -> Path:
        """Absolute checkpoint dir (relative paths are relative to the engine dir)."""
        if self.cpu_engine.checkpoint_dir is None:
            raise ValueError("engine has no checkpoint_dir")
        path = Path(self.cpu_engine.checkpoint_dir)
        if not path.is_absolute():
            if self.engine_dir is None:
                raise ValueError("relative checkpoint_dir needs engine_dir")
            path = self.engine_dir / path
        return path


def load_engine_config(engine_dir: str | os.PathLike[str]) -> EngineConfig:
    """Read and validate <engine_dir>/config.json."""
    engine_dir = Path(engine_dir).resolve()
    config_file = engine_dir / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no config.json in engine dir {engine_dir}")
    data = json.loads(config_file.read_text(encoding="utf-8"))
    if "cpu_engine" not in data:
        raise ValueError(f"{config_file} is not a CPU engine (no 'cpu_engine' section)")
    config = EngineConfig.model_validate(data)
    config.engine_dir = engine_dir
    return config


def link_or_copy_tree(src: Path, dst: Path) -> Path:
    """Hard-link every file of src into dst (same filesystem), copying where linking fails."""
    src, dst = Path(src), Path(dst)
    for root, _dirs, files in os.walk(src):
        target_root = dst / Path(root).relative_to(src)
        target_root.mkdir(parents=True, exist_ok=True)
        for name in files:
            target = target_root / name
            if target.exists():
                target.unlink()
            try:
                os.link(Path(root) / name, target)
            except OSError:
                shutil.copy2(Path(root) / name, target)
    return dst


def write_engine_dir(
    out_dir: str | os.PathLike[str],
    *,
    mode: Literal["hf", "synthetic", "scripted"],
    vocab_size: int,
    eos_token_id: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    pack_checkpoint: bool = True,
    max_batch_size: int = 64,
    max_input_len: int = 1024,
    max_seq_len: int | None = None,
    max_beam_width: int = 1,
    max_num_tokens: int = 8192,
    tokens_per_block: int = 32,
    ttft_ms: float = 0.0,
    itl_ms: float = 0.0,
    seed: int = 0,
    architecture: str = "LlamaForCausalLM",
    dtype: str = "float32",
    device: Literal["auto", "cpu", "cuda"] = "auto",
) -> Path:
    """Write a CPU engine dir. In hf mode with pack_checkpoint the checkpoint is linked/copied
    into <out_dir>/checkpoint so the engine dir is self-contained and relocatable; in scripted
    mode `checkpoint_dir` is the tokenizer, packed the same way."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt: str | None = None
    if mode in ("hf", "scripted"):
        if checkpoint_dir is None:
            raise ValueError(f"{mode} mode needs checkpoint_dir")
        if pack_checkpoint:
            link_or_copy_tree(Path(checkpoint_dir), out / CHECKPOINT_SUBDIR)
            ckpt = CHECKPOINT_SUBDIR
        else:
            ckpt = str(Path(checkpoint_dir).resolve())
    config = EngineConfig(
        pretrained_config=PretrainedConfig(
            architecture=architecture, dtype=dtype, vocab_size=vocab_size
        ),
        build_config=BuildConfig(
            max_batch_size=max_batch_size,
            max_input_len=max_input_len,
            max_seq_len=max_seq_len if max_seq_len is not None else max_input_len + 256,
            max_beam_width=max_beam_width,
            max_num_tokens=max_num_tokens,
            plugin_config=PluginConfig(tokens_per_block=tokens_per_block),
        ),
        cpu_engine=CpuEngineSection(
            mode=mode,
            checkpoint_dir=ckpt,
            ttft_ms=ttft_ms,
            itl_ms=itl_ms,
            eos_token_id=eos_token_id,
            seed=seed,
            device=device,
        ),
    )
    (out / "config.json").write_text(
        json.dumps(config.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8"
    )
    return out
