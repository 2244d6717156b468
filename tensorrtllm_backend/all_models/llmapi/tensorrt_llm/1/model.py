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

import os
import sys

# Triton's python stub ignores PYTHONPATH: the supervisor passes our paths (venv, package) here.
sys.path[:0] = filter(None, os.environ.get("TRTLLM_BACKEND_PYTHONPATH", "").split(os.pathsep))

from tensorrtllm_backend.python_models.llmapi_choice import pick_model

TritonPythonModel = pick_model()
