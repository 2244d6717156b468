"""Pick the llmapi model's implementation once, when Triton imports its model.py: NVIDIA's own
model.py (the one NGC `*-trtllm-python-py3` images ship) where `tensorrt_llm` is importable, our
CPU stand-in elsewhere (:mod:`.cpu_engine.llmapi_model`), or the one TRTLLM_LLMAPI_IMPL names."""

from __future__ import annotations

import importlib.util
import os
import sys

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


def pick_model() -> type:
    choice = llmapi_impl()
    has_trtllm = importlib.util.find_spec("tensorrt_llm") is not None  # no import: CUDA stays off
    if choice == "nvidia" or (choice == "auto" and has_trtllm):
        path = llmapi_model_py()
        if not os.path.isfile(path):
            raise RuntimeError(
                f"tensorrt_llm is installed but NVIDIA's llmapi model.py was not found at {path}: "
                f"set {LLMAPI_MODEL_PY_ENV} to it (TensorRT-LLM's "
                "triton_backend/all_models/llmapi/tensorrt_llm/1/model.py), or "
                f"{LLMAPI_IMPL_ENV}=cpu for the CPU stand-in"
            )
        return _load_nvidia(path)
    from .cpu_engine.llmapi_model import LlmapiCpuModel

    return LlmapiCpuModel
