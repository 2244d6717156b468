"""tensorrt_llm (llmapi workflow): our LLM-API model, or NVIDIA's where the repository asks.

Triton loads this file for the `llmapi` repository; it only bootstraps. The class comes from
tensorrtllm_backend.python_models.llmapi_choice, picked once at import from config.pbtxt's
`llmapi_model` parameter: `bentotrtllm` (python_models/llmapi: tensorrt_llm.LLM where it is
importable, the CPU stand-in elsewhere; TRTLLM_LLMAPI_IMPL=tensorrt_llm|cpu forces one) or
`nvidia` (NVIDIA's own model.py of the NGC image, $TRTLLM_LLMAPI_MODEL_PY).
Both read 1/model.yaml from this directory, as in NVIDIA's own repository.
"""

import os
import sys
from pathlib import Path

# Triton's python stub ignores PYTHONPATH: the supervisor passes our paths (venv, package) here.
sys.path[:0] = filter(None, os.environ.get("TRTLLM_BACKEND_PYTHONPATH", "").split(os.pathsep))

from tensorrtllm_backend.python_models.llmapi_choice import pick_model

TritonPythonModel = pick_model(Path(__file__).resolve().parents[1])
