"""Pick the llmapi model's implementation once, when Triton imports its model.py.

The repository's config.pbtxt names it in the parameter `llmapi_model` (pack_model.py
--llmapi-model): `bentotrtllm` (the default) is ours, :class:`.llmapi.model.LlmapiModel`, over
`tensorrt_llm.LLM` or the CPU stand-in (TRTLLM_LLMAPI_IMPL decides); `nvidia` is NVIDIA's own
model.py (the one NGC `*-trtllm-python-py3` images ship), loaded where tensorrt_llm is the
engine. On a machine without tensorrt_llm ours serves either way: NVIDIA's model cannot run
there, and ours answers its requests as it does.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ..common.model_repository import (
    CONFIG_NAME,
    LLMAPI_MODEL_PARAMETER,
    LLMAPI_MODELS,
    parse_config,
)
from .stub_settings import LLMAPI_IMPL_ENV, LLMAPI_MODEL_PY_ENV, llmapi_impl, llmapi_model_py


def _load_nvidia(path: str) -> type:
    """Import NVIDIA's model.py (its `helpers` module sits beside it) and return its class."""
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location("trtllm_llmapi_nvidia_model", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import NVIDIA's llmapi model.py at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel  # type: ignore[no-any-return]


def configured_model(model_dir: Path) -> str:
    """The `llmapi_model` parameter of the model's config.pbtxt (bentotrtllm when absent)."""
    config = parse_config((model_dir / CONFIG_NAME).read_text(), source=str(model_dir))
    value = (
        config.parameters[LLMAPI_MODEL_PARAMETER].string_value.strip()
        if LLMAPI_MODEL_PARAMETER in config.parameters
        else ""
    )
    choice = value or LLMAPI_MODELS[0]
    if choice not in LLMAPI_MODELS:
        raise RuntimeError(
            f"{model_dir / CONFIG_NAME}: parameter {LLMAPI_MODEL_PARAMETER} is {choice!r}; "
            f"use {' or '.join(LLMAPI_MODELS)}"
        )
    return choice


def pick_model(model_dir: str | os.PathLike[str]) -> type:
    """The TritonPythonModel class for the model in `model_dir` (the folder of config.pbtxt)."""
    impl = llmapi_impl()
    has_trtllm = importlib.util.find_spec("tensorrt_llm") is not None  # no import: CUDA stays off
    real_engine = impl == "tensorrt_llm" or (impl == "auto" and has_trtllm)
    if configured_model(Path(model_dir)) == "nvidia" and real_engine:
        path = llmapi_model_py()
        if not os.path.isfile(path):
            raise RuntimeError(
                f"NVIDIA's llmapi model.py was not found at {path}: set {LLMAPI_MODEL_PY_ENV} to "
                "it (TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm/1/model.py), "
                f"or {LLMAPI_IMPL_ENV}=cpu for the CPU stand-in"
            )
        return _load_nvidia(path)
    from .llmapi.model import LlmapiModel

    return LlmapiModel
