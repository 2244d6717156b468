"""A Triton model repository on disk: config.pbtxt parsed as Triton parses it, the parameters
that hold paths, and replacing a whole repository directory atomically. Used when a repository is
filled at pack time and when it is localized where the model is served."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

CONFIG_NAME = "config.pbtxt"
MODEL_YAML = "model.yaml"  # the llmapi model's settings (NVIDIA's keys)
# Which model.py serves the llmapi repository (its config.pbtxt's parameter): ours, NVIDIA's.
LLMAPI_MODEL_PARAMETER = "llmapi_model"
LLMAPI_MODELS = ("bentotrtllm", "nvidia")
COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")

# Parameters whose value is a filesystem path. Relative values are resolved against the model root
# by localize_repository (a repository in the model store must not bake the pack machine's paths).
# executor_worker_path is left out on purpose: it names a file of the NGC image, never the model.
PATH_PARAMETERS: frozenset[str] = frozenset(
    {
        "tokenizer_dir",  # preprocessing, postprocessing, tensorrt_llm (guided decoding)
        "gpt_model_path",  # tensorrt_llm (engine_dir), preprocessing (multimodal vocab size)
        "encoder_model_path",  # tensorrt_llm (encoder_engine_dir)
        "multimodal_model_path",  # preprocessing
        "lora_prefetch_dir",  # tensorrt_llm
        "xgrammar_tokenizer_info_path",  # tensorrt_llm
    }
)


class TemplateError(ValueError):
    """A template could not be filled into a valid config; the message says what to fix."""


def parse_config(text: str, *, source: str = CONFIG_NAME) -> model_config_pb2.ModelConfig:
    """Parse config.pbtxt text the way Triton does (protobuf text format) into a ModelConfig."""
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        line_no = exc.GetLine() or 0
        lines = text.splitlines()
        line = lines[line_no - 1].strip() if 0 < line_no <= len(lines) else ""
        raise TemplateError(f"{source}: line {line_no}: {exc} (line: {line!r})") from exc


def replace_dir(tmp: Path, dst: Path, *, overwrite: bool) -> None:
    """Move a fully written ``tmp`` into place; an old ``dst`` is removed only afterwards."""
    if dst.exists():
        if not overwrite:
            raise TemplateError(f"{dst} exists; pass overwrite=True to replace it")
        old = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.name}.old-"))
        os.replace(dst, old / dst.name)
        try:
            os.replace(tmp, dst)
        except BaseException:
            os.replace(old / dst.name, dst)  # put the previous repository back
            old.rmdir()
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dst)


def staging_dir(dst: Path, overwrite: bool) -> Path:
    """A fresh directory next to ``dst`` (same filesystem, so the final rename is atomic)."""
    if dst.exists() and not overwrite:
        raise TemplateError(f"{dst} exists; pass overwrite=True to replace it")
    dst.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.name}.tmp-"))


def dump_model_yaml(data: Mapping[str, Any]) -> str:
    header = (
        "# LLM API arguments of tensorrt_llm.LLM (NVIDIA's llmapi model.yaml keys), written by\n"
        "# pack_model.py --workflow llmapi. `model` is relative to the stored model's root until\n"
        "# the service localizes the repository.\n"
    )
    return header + yaml.safe_dump(dict(data), sort_keys=False)
