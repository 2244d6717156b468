"""Reading model-config parameters the way NVIDIA's fill_template leaves them."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...common.tokenization import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_TRUE = {"true", "1", "t", "y", "yes", "on"}
_FALSE = {"false", "0", "f", "n", "no", "off"}


def model_parameter(model_config: dict[str, Any], name: str) -> str | None:
    """The string value of a parameter, or None when missing, empty or an unfilled ${...}.

    fill_template uses safe_substitute, so placeholders nobody filled stay literal.
    """
    value = model_config.get("parameters", {}).get(name, {}).get("string_value")
    if value is None:
        return None
    value = value.strip()
    if not value or value.startswith("${"):
        return None
    return value


def parse_bool(value: str | None, default: bool, name: str = "parameter") -> bool:
    """Parse a boolean parameter; None means the default, anything unknown is an error."""
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{name} must be a boolean (true/false), got {value!r}")


def model_root(model_repository: str) -> Path:
    """args["model_repository"] is <root>/<repo>/<model>: the model root is two levels up."""
    return Path(model_repository).resolve().parent.parent


def resolve_model_path(value: str, model_repository: str) -> Path:
    """Absolute paths as given; relative ones against the model root if they exist there.

    A localized repository holds absolute paths; a repository straight from the store holds
    paths relative to the model root (e.g. "tokenizer"), which is the fallback here.
    """
    path = Path(os.path.expanduser(value))
    if path.is_absolute():
        return path
    candidate = model_root(model_repository) / path
    if candidate.exists():
        return candidate
    return path.resolve()


def engine_vocab_size(engine_dir: Path | None) -> int | None:
    """vocab_size from a TensorRT-LLM (or CPU) engine's config.json, when there is one."""
    if engine_dir is None:
        return None
    config_path = engine_dir / "config.json"
    if not config_path.is_file():
        return None
    try:
        config = json.loads(config_path.read_text())
        return int(config["pretrained_config"]["vocab_size"])
    except (ValueError, KeyError, TypeError):
        return None


def sibling_parameter(model_repository: str, model_name: str, name: str) -> str | None:
    """A string parameter of another model of the same repository, read from its config.pbtxt.

    The BLS model has no tokenizer_dir in NVIDIA's template; it uses the preprocessing model's, so
    one fill command still configures everything. Handles both hand-written and protobuf-written
    text format (`value: {` and `value {`).
    """
    config = Path(model_repository).parent / model_name / "config.pbtxt"
    if not config.is_file():
        return None
    pattern = (
        r'key\s*:\s*"'
        + re.escape(name)
        + r'"\s*value\s*:?\s*\{\s*string_value\s*:\s*"((?:[^"\\]|\\.)*)"'
    )
    match = re.search(pattern, config.read_text())
    if match is None:
        return None
    value = match.group(1).strip()
    return None if not value or value.startswith("${") else value


def model_tokenizer(
    model_config: dict[str, Any],
    model_repository: str,
    model: str,
    fallback_model: str | None = None,
) -> PreTrainedTokenizerBase:
    """The tokenizer named by the model's `tokenizer_dir` parameter, else by `fallback_model`'s.

    NVIDIA's BLS template has no tokenizer_dir: it falls back to the preprocessing model's, so one
    fill command still configures every model. Unset everywhere is an error naming the model.
    """
    tokenizer_dir = model_parameter(model_config, "tokenizer_dir")
    if tokenizer_dir is None and fallback_model is not None:
        tokenizer_dir = sibling_parameter(model_repository, fallback_model, "tokenizer_dir")
    if tokenizer_dir is None:
        where = f" (neither here nor in the {fallback_model} model)" if fallback_model else ""
        raise ValueError(f"{model}: parameter tokenizer_dir is not set{where}")
    return load_tokenizer(resolve_model_path(tokenizer_dir, model_repository))
