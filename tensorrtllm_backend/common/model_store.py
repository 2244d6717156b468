"""The layout of a model packed by pack_model.py in the BentoML model store, and its manifest.
Written at pack time, read where the model is served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MANIFEST = "trtllm_model.json"
ENGINES = "engines"
TOKENIZER = "tokenizer"
REPOSITORY = "model_repository"
FORMAT = "bentotrtllm/1"
# The manifest's record of a vision-language model (absent for text-only models): which model
# takes the images and the token whose positions their features fill. Its processor
# (AutoProcessor) is stored in TOKENIZER, beside the tokenizer.
VISION = "vision"
VISION_KEYS: dict[str, type | tuple[type, ...]] = {
    "architecture": str, "model_type": (str, type(None)), "image_token": str, "image_token_id": int
}  # fmt: skip


class ModelStoreError(ValueError):
    """The stored model is not one this project packed, or not in a format it reads."""


def read_manifest(model_root: Path) -> dict[str, Any]:
    path = model_root / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ModelStoreError(
            f"{model_root} is not a model packed by pack_model.py ({MANIFEST}: {error})"
        ) from error
    if data.get("format") != FORMAT:
        raise ModelStoreError(
            f"{path}: unsupported format {data.get('format')!r}, expected {FORMAT}"
        )
    return dict(data)


def vision_record(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's vision record, {"architecture", "model_type", "image_token",
    "image_token_id"}, for a model that takes images; None for a text-only one."""
    record = manifest.get(VISION)
    if record is None:
        return None
    if not isinstance(record, dict) or any(
        not isinstance(record.get(key), kind) or isinstance(record.get(key), bool)
        for key, kind in VISION_KEYS.items()
    ):
        raise ModelStoreError(
            f"{MANIFEST}: {VISION} must be an object with {', '.join(VISION_KEYS)}, got {record!r}"
        )
    return dict(record)
