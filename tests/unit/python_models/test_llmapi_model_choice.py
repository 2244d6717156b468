"""Which implementation the llmapi repository's 1/model.py serves: ours by default (over
tensorrt_llm or the CPU stand-in), NVIDIA's model.py where config.pbtxt asks for it and
tensorrt_llm is the engine (loaded from the image, with its helpers module), and clear errors
for a missing file or an unknown choice."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import text_format

from tensorrtllm_backend.common.model_repository import parse_config
from tensorrtllm_backend.packing.llmapi_repository import MODEL_NAME, TEMPLATES_DIR


def model_dir(tmp_path: Path, llmapi_model: str | None = None) -> Path:
    """A copy of the template's model folder, its `llmapi_model` parameter set as given."""
    folder = shutil.copytree(TEMPLATES_DIR / MODEL_NAME, tmp_path / MODEL_NAME)
    if llmapi_model is not None:
        config = parse_config((folder / "config.pbtxt").read_text())
        config.parameters["llmapi_model"].string_value = llmapi_model
        (folder / "config.pbtxt").write_text(text_format.MessageToString(config))
    return folder


def load_model_py(folder: Path) -> ModuleType:
    """Import a model folder's 1/model.py as Triton's stub does (a fresh module each time)."""
    spec = importlib.util.spec_from_file_location(
        "llmapi_model_under_test", folder / "1" / "model.py"
    )
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
    folder = tmp_path / "nvidia"
    folder.mkdir()
    (folder / "helpers.py").write_text("ORIGIN = 'nvidia helpers'\n")
    (folder / "model.py").write_text(
        "from helpers import ORIGIN\n\n\nclass TritonPythonModel:\n    origin = ORIGIN\n"
    )
    return folder


def ours() -> type:
    from tensorrtllm_backend.python_models.llmapi.model import LlmapiModel

    return LlmapiModel


def test_ours_serves_by_default(python_backend_utils, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("TRTLLM_LLMAPI_IMPL", raising=False)
    assert importlib.util.find_spec("tensorrt_llm") is None  # this machine: CPU only
    assert load_model_py(model_dir(tmp_path)).TritonPythonModel is ours()


def test_nvidia_model_py_is_loaded_with_its_helpers(
    nvidia_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("TRTLLM_LLMAPI_IMPL", "tensorrt_llm")
    monkeypatch.setenv("TRTLLM_LLMAPI_MODEL_PY", str(nvidia_dir / "model.py"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "helpers", raising=False)
    module = load_model_py(model_dir(tmp_path, "nvidia"))
    assert module.TritonPythonModel.origin == "nvidia helpers"


def test_nvidias_choice_on_the_cpu_engine_is_served_by_ours(
    python_backend_utils, tmp_path: Path, monkeypatch
) -> None:
    """NVIDIA's model cannot run without tensorrt_llm; ours answers its requests as it does."""
    monkeypatch.setenv("TRTLLM_LLMAPI_IMPL", "cpu")
    assert load_model_py(model_dir(tmp_path, "nvidia")).TritonPythonModel is ours()


def test_nvidia_chosen_without_its_model_py_says_what_to_set(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRTLLM_LLMAPI_IMPL", "tensorrt_llm")
    monkeypatch.setenv("TRTLLM_LLMAPI_MODEL_PY", str(tmp_path / "missing.py"))
    with pytest.raises(RuntimeError, match="set TRTLLM_LLMAPI_MODEL_PY"):
        load_model_py(model_dir(tmp_path, "nvidia"))


def test_unknown_choices_are_errors(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRTLLM_LLMAPI_IMPL", "gpu")
    with pytest.raises(RuntimeError, match="use auto, tensorrt_llm or cpu"):
        load_model_py(model_dir(tmp_path))
    monkeypatch.setenv("TRTLLM_LLMAPI_IMPL", "cpu")
    with pytest.raises(RuntimeError, match="use bentotrtllm or nvidia"):
        load_model_py(model_dir(tmp_path / "other", "stock"))
