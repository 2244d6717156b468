"""Which implementation the llmapi repository's 1/model.py serves: NVIDIA's model.py where
tensorrt_llm is importable (loaded from the image, with its helpers module), the CPU stand-in
elsewhere, and a clear error when the image lacks NVIDIA's file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tensorrtllm_backend.packing.llmapi_repository import MODEL_NAME, TEMPLATES_DIR

MODEL_PY = TEMPLATES_DIR / MODEL_NAME / "1" / "model.py"


def load_model_py() -> ModuleType:
    """Import the template's model.py as Triton's stub does (a fresh module each time)."""
    spec = importlib.util.spec_from_file_location("llmapi_model_under_test", MODEL_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def python_backend_utils(monkeypatch: pytest.MonkeyPatch) -> None:
    """triton_python_backend_utils as the stub finds it (the nvidia-pytriton wheel's copy)."""
    pytriton = pytest.importorskip("pytriton")
    backend = Path(pytriton.__file__).parent / "tritonserver" / "backends" / "python"
    monkeypatch.syspath_prepend(str(backend))


@pytest.fixture
def nvidia_dir(tmp_path: Path) -> Path:
    """A directory laid out like NVIDIA's llmapi model version dir: model.py imports helpers."""
    (tmp_path / "helpers.py").write_text("ORIGIN = 'nvidia helpers'\n")
    (tmp_path / "model.py").write_text(
        "from helpers import ORIGIN\n\n\nclass TritonPythonModel:\n    origin = ORIGIN\n"
    )
    return tmp_path


def test_without_tensorrt_llm_the_cpu_stand_in_serves(python_backend_utils, monkeypatch) -> None:
    monkeypatch.delenv("TRTLLM_LLMAPI_IMPL", raising=False)
    assert importlib.util.find_spec("tensorrt_llm") is None  # this machine: CPU only
    from tensorrtllm_backend.python_models.cpu_engine.llmapi_model import LlmapiCpuModel

    assert load_model_py().TritonPythonModel is LlmapiCpuModel


def test_nvidia_model_py_is_loaded_with_its_helpers(nvidia_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRTLLM_LLMAPI_IMPL", "nvidia")
    monkeypatch.setenv("TRTLLM_LLMAPI_MODEL_PY", str(nvidia_dir / "model.py"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "helpers", raising=False)
    assert load_model_py().TritonPythonModel.origin == "nvidia helpers"


def test_nvidia_chosen_without_its_model_py_says_what_to_set(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRTLLM_LLMAPI_IMPL", "nvidia")
    monkeypatch.setenv("TRTLLM_LLMAPI_MODEL_PY", str(tmp_path / "missing.py"))
    with pytest.raises(RuntimeError, match="set TRTLLM_LLMAPI_MODEL_PY"):
        load_model_py()


def test_unknown_choice_is_an_error(monkeypatch) -> None:
    monkeypatch.setenv("TRTLLM_LLMAPI_IMPL", "gpu")
    with pytest.raises(RuntimeError, match="use auto, nvidia or cpu"):
        load_model_py()
