"""The llmapi model repository: the `tensorrt_llm` python model configured by model.yaml.

Unlike the engine templates there is nothing to substitute in config.pbtxt (only its
`llmapi_model` parameter: ours, `bentotrtllm`, or NVIDIA's model.py, `nvidia`): the model's
settings live in ``tensorrt_llm/1/model.yaml`` (NVIDIA's keys: ``model``, ``backend``,
``tensor_parallel_size``, ``pipeline_parallel_size``, ``triton_config.{max_batch_size,
decoupled}``; every other key is an argument of ``tensorrt_llm.LLM``, and
``guided_decoding_backend: xgrammar`` is set unless an argument says otherwise, since the LLM
API drops guides silently without it). ``model`` is stored relative to the model's root and
made absolute on the serving machine by :func:`localize_model_yaml`, so a Bento built on one
machine runs on another.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import text_format

from ..common.model_repository import (
    CONFIG_NAME,
    COPY_IGNORE,
    LLMAPI_MODEL_PARAMETER,
    LLMAPI_MODELS,
    MODEL_YAML,
    TemplateError,
    dump_model_yaml,
    parse_config,
)

TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "all_models" / "llmapi"
MODEL_NAME = "tensorrt_llm"
# Keys model.yaml sets from pack_model's own flags: --llm-arg may not override them.
RESERVED_KEYS = frozenset(
    {"model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "triton_config"}
)
BACKENDS = ("pytorch",)
DEFAULT_LLM_ARGS = {"guided_decoding_backend": "xgrammar"}


def parse_llm_args(items: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs to LLM API arguments. Values are YAML (``0.8`` a float, ``true`` a
    bool, ``[1, 2]`` a list); dotted keys nest (``kv_cache_config.free_gpu_memory_fraction=0.8``)."""
    args: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise TemplateError(f"--llm-arg expects KEY=VALUE (KEY may be dotted), got {item!r}")
        if key.split(".")[0] in RESERVED_KEYS:
            raise TemplateError(
                f"--llm-arg {key}: set by pack_model itself (--checkpoint, --backend, --tp, --pp)"
            )
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as error:
            raise TemplateError(f"--llm-arg {key}: {text!r} is not a YAML value: {error}") from None
        target = args
        *parents, leaf = key.split(".")
        for part in parents:
            node = target.setdefault(part, {})
            if not isinstance(node, dict):
                raise TemplateError(f"--llm-arg {key}: {part} was already given a value")
            target = node
        if isinstance(target.get(leaf), dict):
            raise TemplateError(f"--llm-arg {key}: already has nested keys")
        target[leaf] = value
    return args


def build_model_yaml(
    *,
    model: str,
    tp_size: int = 1,
    pp_size: int = 1,
    backend: str = "pytorch",
    llm_args: Mapping[str, Any] | None = None,
    decoupled: bool = True,
) -> dict[str, Any]:
    """model.yaml's content: the template's keys filled, plus LLM API arguments."""
    if backend not in BACKENDS:
        raise TemplateError(f"backend {backend!r}: the llmapi workflow supports {BACKENDS}")
    template = yaml.safe_load((TEMPLATES_DIR / MODEL_NAME / "1" / MODEL_YAML).read_text())
    clash = RESERVED_KEYS & set(llm_args or {})
    if clash:
        raise TemplateError(f"LLM API arguments may not set {', '.join(sorted(clash))}")
    data = {
        **template,
        "model": model,
        "backend": backend,
        "tensor_parallel_size": tp_size,
        "pipeline_parallel_size": pp_size,
        "triton_config": {**template["triton_config"], "decoupled": decoupled},
        **DEFAULT_LLM_ARGS,
    }
    data.update(llm_args or {})
    return data


def write_llmapi_repository(
    dst: Path, model_yaml: Mapping[str, Any], llmapi_model: str = LLMAPI_MODELS[0]
) -> Path:
    """Write the llmapi repository (config.pbtxt, 1/model.py, 1/model.yaml) to ``dst``.

    The config is parsed as Triton does before anything is written; ``dst`` must not exist.
    """
    if llmapi_model not in LLMAPI_MODELS:
        raise TemplateError(f"llmapi model {llmapi_model!r}: use {' or '.join(LLMAPI_MODELS)}")
    source = TEMPLATES_DIR / MODEL_NAME
    text = (source / CONFIG_NAME).read_text()
    config = parse_config(text, source=f"{MODEL_NAME}/{CONFIG_NAME}")
    if config.name != MODEL_NAME:
        raise TemplateError(f"{MODEL_NAME}/{CONFIG_NAME}: name is {config.name!r}")
    if Path(dst).exists():
        raise TemplateError(f"{dst} exists")
    target = Path(dst) / MODEL_NAME
    shutil.copytree(source, target, ignore=COPY_IGNORE)
    if config.parameters[LLMAPI_MODEL_PARAMETER].string_value != llmapi_model:
        config.parameters[LLMAPI_MODEL_PARAMETER].string_value = llmapi_model
        (target / CONFIG_NAME).write_text(text_format.MessageToString(config))
    (target / "1" / MODEL_YAML).write_text(dump_model_yaml(model_yaml), encoding="utf-8")
    return Path(dst)
