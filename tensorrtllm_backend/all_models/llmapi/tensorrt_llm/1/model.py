"""tensorrt_llm (llmapi workflow): NVIDIA's LLM API model on a GPU host, our CPU stand-in elsewhere.

Triton loads this file for the `llmapi` repository. It picks the implementation once, at import:

* NVIDIA's model.py (the one NGC `*-trtllm-python-py3` images ship) when `tensorrt_llm` is
  importable by this stub's Python, found at $TRTLLM_LLMAPI_MODEL_PY or the image's
  /app/all_models/llmapi/tensorrt_llm/1/model.py. It reads 1/model.yaml from this directory,
  as it does in NVIDIA's own repository.
* tensorrtllm_backend.python_models.cpu_engine.llmapi_model otherwise: the same tensors served by the CPU
  engine from the same checkpoint.

TRTLLM_LLMAPI_IMPL=nvidia|cpu forces one (auto by default).
"""

import importlib.util
import os
import sys

# Triton's python stub ignores PYTHONPATH: the supervisor passes our paths (venv, package) here.
sys.path[:0] = filter(None, os.environ.get("TRTLLM_BACKEND_PYTHONPATH", "").split(os.pathsep))

NVIDIA_MODEL_PY_ENV = "TRTLLM_LLMAPI_MODEL_PY"
IMPL_ENV = "TRTLLM_LLMAPI_IMPL"
NGC_MODEL_PY = "/app/all_models/llmapi/tensorrt_llm/1/model.py"


def _nvidia_model_py() -> str | None:
    path = os.environ.get(NVIDIA_MODEL_PY_ENV) or NGC_MODEL_PY
    return path if os.path.isfile(path) else None


def _load_nvidia(path: str):
    """Import NVIDIA's model.py (its `helpers` module sits beside it) and return its class."""
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location("trtllm_llmapi_nvidia_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel


def _pick():
    choice = os.environ.get(IMPL_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "nvidia", "cpu"):
        raise RuntimeError(f"{IMPL_ENV}={choice!r}: use auto, nvidia or cpu")
    has_trtllm = importlib.util.find_spec("tensorrt_llm") is not None  # no import: CUDA stays off
    if choice == "nvidia" or (choice == "auto" and has_trtllm):
        path = _nvidia_model_py()
        if path is None:
            raise RuntimeError(
                "tensorrt_llm is installed but NVIDIA's llmapi model.py was not found at "
                f"{os.environ.get(NVIDIA_MODEL_PY_ENV) or NGC_MODEL_PY}: set {NVIDIA_MODEL_PY_ENV} "
                f"to it (TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm/1/model.py), "
                f"or {IMPL_ENV}=cpu for the CPU stand-in"
            )
        return _load_nvidia(path)
    from tensorrtllm_backend.python_models.cpu_engine.llmapi_model import LlmapiCpuModel

    return LlmapiCpuModel


TritonPythonModel = _pick()
