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
