"""LoRA adapters stored with the model and selected per request.

Engines (the C++ backend) take adapters in TensorRT-LLM's converted format: a directory with
``model.lora_weights.npy`` ([1, N, D] or [N, D], float16) and ``model.lora_config.npy``
([1, N, 3] or [N, 3], int32 rows of [module_id, layer, rank]) — what TensorRT-LLM's
``hf_lora_convert.py`` writes. The backend caches adapters by ``lora_task_id``: the first request
of an adapter carries weights and config, later ones only the id; when the backend reports the id
missing from its cache, the request is sent again with the weights.

The LLM API reads Hugging Face (PEFT) adapters from their directory (``adapter_config.json`` and
the weights) itself: a request names the adapter's id, name and path.
"""

from __future__ import annotations

import json
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

WEIGHTS_FILE = "model.lora_weights.npy"
CONFIG_FILE = "model.lora_config.npy"
HF_CONFIG_FILE = "adapter_config.json"
HF_WEIGHTS_FILES = ("adapter_model.safetensors", "adapter_model.bin")
LORAS = "loras"  # folder inside a stored model


class LoraError(ValueError):
    """An adapter directory is unusable; the message says why."""


def check_adapter_dir(path: Path) -> tuple[int, int]:
    """Validate an adapter dir without loading the weights; returns (rows, row width)."""
    weights_path, config_path = path / WEIGHTS_FILE, path / CONFIG_FILE
    for needed in (weights_path, config_path):
        if not needed.is_file():
            raise LoraError(
                f"{path}: {needed.name} is missing (convert the adapter with TensorRT-LLM's "
                "hf_lora_convert.py)"
            )
    try:
        weights = np.load(weights_path, mmap_mode="r")
        config = np.load(config_path, mmap_mode="r")
    except (OSError, ValueError) as error:
        raise LoraError(f"{path}: cannot read the adapter arrays: {error}") from error
    weights2d = weights.reshape(-1, weights.shape[-1]) if weights.ndim in (2, 3) else None
    config2d = config.reshape(-1, config.shape[-1]) if config.ndim in (2, 3) else None
    if weights2d is None or config2d is None or config2d.shape[-1] != 3:
        raise LoraError(
            f"{path}: expected weights [N, D] and config [N, 3] (optionally with a leading 1), "
            f"got {weights.shape} and {config.shape}"
        )
    if weights2d.shape[0] != config2d.shape[0]:
        raise LoraError(
            f"{path}: weights have {weights2d.shape[0]} rows but config has {config2d.shape[0]}"
        )
    return int(weights2d.shape[0]), int(weights2d.shape[1])


def check_name(name: str) -> None:
    """An adapter's name: what requests select it by, and its folder in the stored model."""
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise LoraError(f"LoRA name {name!r}: use letters, digits, '-', '_' or '.'")


def check_hf_adapter_dir(path: Path) -> tuple[int, list[Path]]:
    """Validate a Hugging Face LoRA adapter dir; returns (its rank r, the files to store)."""
    config_path = path / HF_CONFIG_FILE
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LoraError(
            f"{path}: {HF_CONFIG_FILE} is missing (a Hugging Face PEFT adapter directory, as "
            "save_pretrained writes it)"
        ) from None
    except (OSError, ValueError) as error:
        raise LoraError(f"{config_path} is not JSON: {error}") from error
    if not isinstance(config, dict) or str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise LoraError(
            f"{config_path}: not a LoRA adapter (peft_type {config.get('peft_type')!r})"
        )
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LoraError(f"{config_path}: `r` (the rank) must be a whole number >= 1, got {rank!r}")
    weights = [path / name for name in HF_WEIGHTS_FILES if (path / name).is_file()]
    if not weights:
        raise LoraError(f"{path}: no adapter weights ({' or '.join(HF_WEIGHTS_FILES)})")
    return rank, [config_path, *weights]


def task_id_for(name: str) -> int:
    """A stable, non-zero id per adapter name (the same across restarts and replicas)."""
    return zlib.crc32(name.encode()) or 1


@dataclass
class LoraAdapter:
    name: str
    path: Path
    task_id: int

    @property
    def nbytes(self) -> int:
        """Bytes of the adapter's files: what :meth:`tensors` reads (0 if they are gone)."""
        try:
            return sum((self.path / name).stat().st_size for name in (WEIGHTS_FILE, CONFIG_FILE))
        except OSError:
            return 0

    def tensors(self) -> tuple[np.ndarray, np.ndarray]:
        """(lora_weights [1, N, D] float16, lora_config [1, N, 3] int32) as the backend wants.
        Reads the files (megabytes): the service calls it off the event loop."""
        weights = np.load(self.path / WEIGHTS_FILE)
        config = np.load(self.path / CONFIG_FILE)
        return (
            weights.reshape(1, -1, weights.shape[-1]).astype(np.float16, copy=False),
            config.reshape(1, -1, 3).astype(np.int32, copy=False),
        )


@dataclass
class LoraRegistry:
    """The adapters stored with a model, and which ones the backend has already been sent."""

    adapters: dict[str, LoraAdapter] = field(default_factory=dict)
    _sent: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_model(cls, model_root: Path) -> LoraRegistry:
        folder = model_root / LORAS
        if not folder.is_dir():
            return cls()
        return cls(
            {
                path.name: LoraAdapter(path.name, path, task_id_for(path.name))
                for path in sorted(folder.iterdir())
                if path.is_dir()
            }
        )

    def names(self) -> list[str]:
        return sorted(self.adapters)

    def get(self, name: str) -> LoraAdapter | None:
        return self.adapters.get(name)

    def needs_weights(self, adapter: LoraAdapter) -> bool:
        with self._lock:
            return adapter.name not in self._sent

    def mark_sent(self, adapter: LoraAdapter, sent: bool = True) -> None:
        with self._lock:
            (self._sent.add if sent else self._sent.discard)(adapter.name)
