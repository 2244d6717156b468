"""Localize a stored model repository where the model is served: relative path parameters of
every config.pbtxt (engines, tokenizer) and the llmapi model.yaml's `model` become absolute under
the model's root, so a Bento built on one machine runs on another."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ..common.model_repository import (
    CONFIG_NAME,
    COPY_IGNORE,
    MODEL_YAML,
    PATH_PARAMETERS,
    TemplateError,
    dump_model_yaml,
    parse_config,
    replace_dir,
    staging_dir,
)


def localize_config(config: model_config_pb2.ModelConfig, model_root: Path) -> list[str]:
    """Make relative PATH_PARAMETERS of ``config`` absolute under ``model_root``, in place.

    Returns the keys rewritten. Empty values and unfilled ``${...}`` values mean "not set" and are
    left alone; absolute values stay as they are.
    """
    root = Path(os.path.abspath(model_root))
    changed = []
    for key in sorted(PATH_PARAMETERS & set(config.parameters)):
        value = config.parameters[key].string_value
        if not value or value.startswith("${") or os.path.isabs(value):
            continue
        config.parameters[key].string_value = os.path.normpath(root / value)
        changed.append(key)
    return changed


def set_engine_instances(config: model_config_pb2.ModelConfig, count: int) -> bool:
    """Run ``count`` instances of the CPU stand-in's ``tensorrt_llm`` model, in place.

    Each instance is its own Python stub process with its own scheduler, so the stand-in's
    response rate grows with the count (one stub sends at most a few thousand responses a
    second). Triton spreads requests over the instances. NVIDIA's C++ backend batches in flight
    inside one instance and is left alone. Returns whether the config changed.
    """
    if count < 1:
        raise TemplateError(f"engine instances must be 1 or more, not {count}")
    if config.name != "tensorrt_llm" or config.backend != "python":
        return False
    if len(config.instance_group) == 1 and config.instance_group[0].count == count:
        return False
    del config.instance_group[:]
    config.instance_group.add(count=count, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    return True


def localize_repository(
    src: Path,
    dst: Path,
    model_root: Path,
    *,
    overwrite: bool = False,
    engine_instances: int | None = None,
) -> Path:
    """Copy the filled repository ``src`` to ``dst`` with relative path parameters made absolute.

    A repository stored with the model holds paths relative to the model's root (``engines``,
    ``tokenizer``); at service start they are resolved against where the model now lives. Configs
    are rewritten through protobuf (parse, modify, serialize), so comments are not kept; so is
    the llmapi model's ``1/model.yaml`` (its ``model`` checkpoint path).
    ``engine_instances`` sets the CPU stand-in's instance count (see set_engine_instances).
    """
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise TemplateError(f"{src} is not a model repository directory")
    tmp = staging_dir(dst, overwrite)
    try:
        shutil.copytree(src, tmp, ignore=COPY_IGNORE, dirs_exist_ok=True)
        for config_path in sorted(tmp.glob(f"*/{CONFIG_NAME}")):
            source = f"{config_path.parent.name}/{CONFIG_NAME}"
            config = parse_config(config_path.read_text(), source=source)
            changed = bool(localize_config(config, model_root))
            if engine_instances is not None:
                changed = set_engine_instances(config, engine_instances) or changed
            if changed:
                config_path.write_text(text_format.MessageToString(config))
        localize_model_yaml(tmp, model_root)
        replace_dir(tmp, dst, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def localize_model_yaml(repository: Path, model_root: Path) -> list[Path]:
    """Make a relative ``model`` (and ``lora_config.lora_dir`` entries) in every
    ``*/1/model.yaml`` of ``repository`` absolute under ``model_root``, in place; returns the
    files rewritten. Hub ids (``org/name``) that do not exist under the model root are left
    alone."""
    root = Path(os.path.abspath(model_root))

    def local(value: object) -> object:
        if isinstance(value, str) and not os.path.isabs(value) and (root / value).exists():
            return os.path.normpath(root / value)
        return value

    changed = []
    for path in sorted(Path(repository).glob(f"*/*/{MODEL_YAML}")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("model"), str):
            continue
        before = yaml.safe_dump(data)
        data["model"] = local(data["model"])
        lora = data.get("lora_config")
        if isinstance(lora, dict) and isinstance(lora.get("lora_dir"), list):
            lora["lora_dir"] = [local(value) for value in lora["lora_dir"]]
        if yaml.safe_dump(data) == before:
            continue
        path.write_text(dump_model_yaml(data), encoding="utf-8")
        changed.append(path)
    return changed
