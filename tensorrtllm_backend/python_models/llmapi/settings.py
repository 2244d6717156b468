"""1/model.yaml of the llmapi model, read as NVIDIA's model reads it.

Every key but `triton_config` is an argument of `tensorrt_llm.LLM` (`model` the checkpoint,
`backend: pytorch`, parallelism, `kv_cache_config`, ...); `triton_config` holds the model's own
settings: `max_batch_size` and `decoupled` (applied in auto_complete_config) and
`cancellation_check_period_ms` (how often cancelled requests are looked for, default 100).
A few LLM arguments also shape what the model does: `guided_decoding_backend` (without it the LLM
API would drop guides silently, so the model refuses guided requests instead),
`stream_interval` and `return_perf_metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..stub_settings import llm_config_path

CONFIG_FILE = "model.yaml"
DEFAULT_CANCELLATION_CHECK_MS = 100


class SettingsError(ValueError):
    """model.yaml cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class ModelSettings:
    path: Path
    llm_args: dict[str, Any]  # tensorrt_llm.LLM(**llm_args)
    max_batch_size: int
    decoupled: bool
    cancellation_check_period_ms: int

    @property
    def guided_decoding_backend(self) -> str | None:
        value = self.llm_args.get("guided_decoding_backend")
        return str(value) if value else None

    @property
    def stream_interval(self) -> int:
        return int(self.llm_args.get("stream_interval") or 1)

    @property
    def return_perf_metrics(self) -> bool:
        return bool(self.llm_args.get("return_perf_metrics"))


def read_model_settings(version_dir: str | Path) -> ModelSettings:
    """1/model.yaml ($LLM_CONFIG_PATH names another file, relative to `version_dir`)."""
    path = Path(version_dir) / (llm_config_path() or CONFIG_FILE)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise SettingsError(f"cannot read {path}: {error}") from error
    if not isinstance(data, dict) or "model" not in data or "triton_config" not in data:
        raise SettingsError(f"{path} needs `model` and `triton_config` keys")
    triton = data.pop("triton_config") or {}
    if not isinstance(triton, dict):
        raise SettingsError(f"{path}: triton_config must be a mapping")
    interval = data.get("stream_interval", 1)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise SettingsError(f"{path}: stream_interval must be a whole number >= 1")
    return ModelSettings(
        path=path,
        llm_args=data,
        max_batch_size=int(triton.get("max_batch_size", 0)),
        decoupled=bool(triton.get("decoupled", False)),
        cancellation_check_period_ms=int(
            triton.get("cancellation_check_period_ms", DEFAULT_CANCELLATION_CHECK_MS)
        ),
    )


def checkpoint_dir(model: str, version_dir: Path) -> Path:
    """`model` as a directory: absolute as written (the service localizes it), else relative to
    the stored model's root (the repository's parent), the repository, or the version dir."""
    path = Path(model)
    if path.is_absolute():
        return path
    for base in (version_dir.parents[2], version_dir.parents[1], version_dir):
        if (base / path / "config.json").is_file():
            return (base / path).resolve()
    raise SettingsError(f"model.yaml: checkpoint {model!r} not found")
