"""fill_template CLI: NVIDIA's command syntax, run as a real subprocess on copies of the templates."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from tensorrtllm_backend.common.model_repository import TemplateError, parse_config
from tensorrtllm_backend.packing.fill_template import main, parse_substitutions
from tensorrtllm_backend.packing.repository import TEMPLATES_DIR

ROOT = Path(__file__).resolve().parents[3]
PYTHON = sys.executable

# The commands of the BentoML TensorRT-LLM guide, verbatim (paths aside).
GUIDE_COMMANDS = {
    "preprocessing": "tokenizer_dir:/x,tokenizer_type:auto,triton_max_batch_size:2048,preprocessing_instance_count:1",
    "postprocessing": "tokenizer_dir:/x,tokenizer_type:auto,triton_max_batch_size:2048,postprocessing_instance_count:8",
    "tensorrt_llm_bls": "triton_max_batch_size:2048,decoupled_mode:True,bls_instance_count:1,accumulate_tokens:False",
    "ensemble": "triton_max_batch_size:2048",
    "tensorrt_llm": (
        "triton_backend:tensorrtllm,triton_max_batch_size:2048,decoupled_mode:True,max_beam_width:1,"
        "engine_dir:/e,max_tokens_in_paged_kv_cache:,max_attention_window_size:2560,"
        "kv_cache_free_gpu_mem_fraction:0.9,exclude_input_in_output:True,"
        "batching_strategy:inflight_fused_batching,max_queue_delay_microseconds:0,enable_chunked_context:True"
    ),
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    dst = tmp_path / "triton_model_repo"
    shutil.copytree(TEMPLATES_DIR, dst)
    return dst


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    return subprocess.run(
        [PYTHON, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _params(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def _assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize("model", list(GUIDE_COMMANDS))
def test_guide_command_fills_in_place(repo: Path, model: str) -> None:
    path = repo / model / "config.pbtxt"
    result = _run(
        "-m", "tensorrtllm_backend.packing.fill_template", "-i", str(path), GUIDE_COMMANDS[model]
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    text = path.read_text()
    assert "${" not in text
    config = parse_config(text)
    assert config.name == model and config.max_batch_size == 2048
    params = _params(config)
    if model in ("preprocessing", "postprocessing"):
        assert params["tokenizer_dir"] == "/x" and params["tokenizer_type"] == "auto"
        assert config.instance_group[0].count == (1 if model == "preprocessing" else 8)
    elif model == "tensorrt_llm_bls":
        assert config.model_transaction_policy.decoupled is True
        assert params["accumulate_tokens"] == "False"
    elif model == "tensorrt_llm":
        assert config.backend == "tensorrtllm"
        assert config.model_transaction_policy.decoupled is True
        assert params["gpt_model_path"] == "/e"
        assert params["max_tokens_in_paged_kv_cache"] == ""
        assert params["max_attention_window_size"] == "2560"
        assert params["exclude_input_in_output"] == "True"
        assert params["enable_chunked_context"] == "True"
        assert config.dynamic_batching.default_queue_policy.max_queue_size == 0


def test_runs_as_a_script_too(repo: Path) -> None:
    path = repo / "ensemble" / "config.pbtxt"
    result = _run(
        str(ROOT / "tensorrtllm_backend" / "packing" / "fill_template.py"),
        "-i",
        str(path),
        "triton_max_batch_size:16",
        cwd=repo,
    )
    assert result.returncode == 0, result.stderr
    assert parse_config(path.read_text()).max_batch_size == 16


def test_without_in_place_prints_and_leaves_the_file(repo: Path) -> None:
    path = repo / "postprocessing" / "config.pbtxt"
    before = path.read_bytes()
    result = _run(
        "-m", "tensorrtllm_backend.packing.fill_template", str(path), "tokenizer_dir:/tok"
    )
    assert result.returncode == 0, result.stderr
    assert path.read_bytes() == before
    assert _params(parse_config(result.stdout))["tokenizer_dir"] == "/tok"


@pytest.mark.parametrize(
    ("model", "options", "values", "expected"),
    [
        ("tensorrt_llm", [], "engine_dir:/e,tokenizer_type:auto", ["tokenizer_type", "valid keys"]),
        ("ensemble", ["--no-defaults"], "triton_max_batch_size:8", ["left unfilled", "logits_datatype"]),
        ("tensorrt_llm_bls", [], "decoupled_mode:sometimes", ["decoupled_mode", "true or false"]),
    ],
    ids=["unknown-key", "leftover-placeholder", "malformed-value"],
)  # fmt: skip
def test_a_bad_fill_fails_and_leaves_the_file(
    repo: Path, model: str, options: list[str], values: str, expected: list[str]
) -> None:
    path = repo / model / "config.pbtxt"
    before = path.read_bytes()
    result = _run(
        "-m", "tensorrtllm_backend.packing.fill_template", "-i", *options, str(path), values
    )
    _assert_one_line_error(result, *expected)
    assert path.read_bytes() == before


def test_usage_errors_are_one_line_with_exit_code_2(repo: Path) -> None:
    _assert_one_line_error(_run("-m", "tensorrtllm_backend.packing.fill_template"), "file_path")
    _assert_one_line_error(
        _run(
            "-m", "tensorrtllm_backend.packing.fill_template", "-i", str(repo / "nope.pbtxt"), "a:b"
        ),
        "cannot read",
    )
    _assert_one_line_error(
        _run(
            "-m",
            "tensorrtllm_backend.packing.fill_template",
            str(repo / "ensemble" / "config.pbtxt"),
            "novalue",
        ),
        "key:value",
    )


# In-process from here on: argument parsing and model detection need no subprocess.


def test_substitution_syntax() -> None:
    assert parse_substitutions("") == {}
    assert parse_substitutions("a:1,b:,c:x") == {"a": "1", "b": "", "c": "x"}
    assert parse_substitutions(r"gpu_device_ids:0\,1,d:/p:q,e:x\:y") == {
        "gpu_device_ids": "0,1",
        "d": "/p:q",
        "e": "x:y",
    }
    assert parse_substitutions(r"w:a\\b") == {"w": "a\\b"}
    with pytest.raises(TemplateError, match="twice"):
        parse_substitutions("a:1,a:2")
    with pytest.raises(TemplateError, match="key:value"):
        parse_substitutions(":1")


def test_model_detected_from_name_when_the_folder_is_renamed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "my_llm" / "config.pbtxt"
    path.parent.mkdir()
    shutil.copy(TEMPLATES_DIR / "tensorrt_llm" / "config.pbtxt", path)
    assert main(["-i", str(path), "triton_backend:python,engine_dir:/e"]) == 0
    config = parse_config(path.read_text())
    assert config.backend == "python" and config.model_transaction_policy.decoupled is True

    other = tmp_path / "x" / "config.pbtxt"
    other.parent.mkdir()
    other.write_text('name: "custom"\nmax_batch_size: ${triton_max_batch_size}\n')
    assert main([str(other), "triton_max_batch_size:3"]) == 2
    assert "--model" in capsys.readouterr().err
    assert main(["--model", "ensemble", str(other), "triton_max_batch_size:3"]) == 0
    assert "max_batch_size: 3" in capsys.readouterr().out


def test_escaped_comma_reaches_the_config(repo: Path) -> None:
    path = repo / "tensorrt_llm" / "config.pbtxt"
    assert main(["-i", str(path), r"gpu_device_ids:0\,1,tokenizer_dir:/a:b"]) == 0
    params = _params(parse_config(path.read_text()))
    assert params["gpu_device_ids"] == "0,1" and params["tokenizer_dir"] == "/a:b"
