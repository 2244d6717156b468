"""The `TRTLLM_*` variables read inside Triton's python stubs (the service's are in settings.py).

The stubs are processes of their own, started by tritonserver with the environment the
supervisor gave it; they read these when a model loads. (`TRTLLM_BACKEND_PYTHONPATH` is read by
each model.py before this package can be imported there.)
"""

from __future__ import annotations

import os

ORPHAN_GRACE_ENV = "TRTLLM_CPU_ENGINE_ORPHAN_GRACE_S"
LLMAPI_IMPL_ENV = "TRTLLM_LLMAPI_IMPL"
LLMAPI_MODEL_PY_ENV = "TRTLLM_LLMAPI_MODEL_PY"
NGC_LLMAPI_MODEL_PY = "/app/all_models/llmapi/tensorrt_llm/1/model.py"
LLMAPI_IMPLS = ("auto", "nvidia", "cpu")


def cpu_engine_grace_s() -> float:
    """How long a CPU engine's stub may take to exit by itself once tritonserver is gone (tests
    shorten it)."""
    return float(os.environ.get(ORPHAN_GRACE_ENV) or 10)


def llmapi_impl() -> str:
    """Which implementation the llmapi model serves: auto (NVIDIA's where tensorrt_llm is
    importable), nvidia or cpu."""
    choice = os.environ.get(LLMAPI_IMPL_ENV, "").strip().lower() or "auto"
    if choice not in LLMAPI_IMPLS:
        *others, last = LLMAPI_IMPLS
        raise RuntimeError(f"{LLMAPI_IMPL_ENV}={choice!r}: use {', '.join(others)} or {last}")
    return choice


def llmapi_model_py() -> str:
    """Where NVIDIA's llmapi model.py is: $TRTLLM_LLMAPI_MODEL_PY, else the NGC image's."""
    return os.environ.get(LLMAPI_MODEL_PY_ENV) or NGC_LLMAPI_MODEL_PY
