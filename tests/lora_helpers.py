"""LoRA adapter files in TensorRT-LLM's converted format, written for the unit and integration
tests alike (the format `tensorrtllm_backend.common.lora` validates)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tensorrtllm_backend.common.lora import CONFIG_FILE, WEIGHTS_FILE


def write_adapter(path: Path, rows: int = 4, width: int = 32, leading_one: bool = True) -> Path:
    """A converted adapter of `rows` LoRA modules: weights [1, rows, width] and config
    [1, rows, 3] (without the leading 1 when `leading_one` is false)."""
    path.mkdir(parents=True)
    shape = (1, rows, width) if leading_one else (rows, width)
    weights = np.arange(np.prod(shape), dtype=np.float16).reshape(shape)
    config = np.array([[i % 3, i // 3, 8] for i in range(rows)], dtype=np.int32)
    np.save(path / WEIGHTS_FILE, weights)
    np.save(path / CONFIG_FILE, config.reshape(1, rows, 3) if leading_one else config)
    return path
