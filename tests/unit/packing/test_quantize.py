# ruff: noqa: F811  (fixtures shared with test_pack_model are imported, then requested)
"""pack_model.py --quantize: ModelOpt quantizes a full-precision checkpoint at pack time,
calibrated on local text (a file, a folder, or the shipped text), and the unified export is
packed and recorded as any pre-quantized checkpoint is; what cannot work is refused before the
calibration starts, with what would."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from test_pack_model import name, run_pack, stored_model, unchanged_store  # noqa: F401

from tensorrtllm_backend.common.model_store import read_manifest
from tensorrtllm_backend.packing.engine_packing import PackError
from tensorrtllm_backend.packing.quantize import (
    DEFAULT_CALIBRATION,
    calibration_texts,
    quantize_config,
)

# --- calibration text ---------------------------------------------------------------------------


def test_the_shipped_text_is_the_default_calibration() -> None:
    samples = calibration_texts(None, 1000)
    assert len(samples) == len([p for p in DEFAULT_CALIBRATION.read_text().split("\n\n") if p])
    assert calibration_texts(None, 5) == samples[:5]


def test_calibration_from_a_text_file_a_jsonl_file_and_a_folder(tmp_path: Path) -> None:
    text = tmp_path / "data" / "a.txt"
    text.parent.mkdir()
    text.write_text("first paragraph\nstill the first\n\n\nsecond\n")
    lines = tmp_path / "data" / "b.jsonl"
    lines.write_text('{"text": "third"}\n\n"fourth"\n{"text": "fifth", "id": 5}\n')
    (tmp_path / "data" / "ignored.md").write_text("not calibration text")
    assert calibration_texts(text, 10) == ["first paragraph\nstill the first", "second"]
    assert calibration_texts(lines, 10) == ["third", "fourth", "fifth"]
    assert calibration_texts(text.parent, 4) == ["first paragraph\nstill the first", "second",
                                                 "third", "fourth"]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "size", "message"),
    [
        (None, 8, "does not exist"),
        ("", 8, "holds no text"),
        ('{"text": 3}\n', 8, "expected a string or an object with `text`"),
        ("{not json\n", 8, "not JSON"),
        ('"fine"\n', 0, "at least 1"),
    ],
)
def test_unusable_calibration_data_is_named(
    tmp_path: Path, content: str | None, size: int, message: str
) -> None:
    path = tmp_path / "calib.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(PackError, match=message):
        calibration_texts(path, size)


def test_a_folder_without_text_files_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="no .txt or .jsonl files"):
        calibration_texts(tmp_path, 8)


def test_the_kv_cache_rule_is_added_to_the_formats() -> None:
    import modelopt.torch.quantization as mtq

    kv_rule = mtq.FP8_KV_CFG["quant_cfg"][0]
    assert kv_rule not in quantize_config(mtq, "int4_awq", None)["quant_cfg"]
    with_kv = quantize_config(mtq, "int4_awq", "fp8")
    assert with_kv["quant_cfg"][-1] == kv_rule
    assert with_kv["algorithm"] == mtq.INT4_AWQ_CFG["algorithm"]  # AWQ's search kept
    assert kv_rule not in mtq.INT4_AWQ_CFG["quant_cfg"]  # ModelOpt's own left alone


# --- packing ------------------------------------------------------------------------------------


def test_the_demo_quantized_to_fp8_is_packed_and_recorded(name: str, capsys) -> None:
    code = run_pack("--demo", "--quantize", "fp8", "--kv-cache-dtype", "fp8", "--calib-size",
                    "4", "--name", name)  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "quantized:    fp8 (KV cache fp8) with ModelOpt on 4 calibration samples" in out
    assert "quantization: FP8, KV cache FP8 (hf_quant_config.json)" in out
    with stored_model(name) as model:
        root = Path(model.path)
        recorded = read_manifest(root)["engine"]["quantization"]
        assert {key: value for key, value in recorded.items() if value is not None} == {
            "algorithm": "FP8", "kv_cache": "FP8", "source": "hf_quant_config.json",
        }  # fmt: skip
        checkpoint = next(root.rglob("hf_quant_config.json")).parent
        quant = json.loads((checkpoint / "hf_quant_config.json").read_text())["quantization"]
        assert (quant["quant_algo"], quant["kv_cache_quant_algo"]) == ("FP8", "FP8")
        assert (checkpoint / "tokenizer.json").is_file()  # the source's files came along
        assert (checkpoint / "chat_template.jinja").is_file()


def test_a_checkpoint_is_quantized_for_the_llm_api(
    demo_checkpoint: Path, tmp_path: Path, unchanged_store, capsys
) -> None:
    source = shutil.copytree(demo_checkpoint, tmp_path / "Tiny-Llama")
    code = run_pack("--checkpoint", str(source), "--quantize", "fp8", "--calib-size", "2",
                    "--dry-run")  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "model:        trtllm-tiny-llama-fp8" in out
    assert "quantization: FP8 (hf_quant_config.json)" in out
    assert not (source / "hf_quant_config.json").exists()  # the source is left as it was


def test_the_calibration_shows_a_progress_bar(name: str, unchanged_store, capsys) -> None:
    import pack_model

    assert pack_model.main(["--demo", "--quantize", "fp8", "--calib-size", "3", "--dry-run"]) == 0
    assert "calibrating (fp8)" in capsys.readouterr().err


def test_nvfp4_for_the_cpu_stand_in_is_refused_before_calibrating(
    name: str, unchanged_store, capsys
) -> None:
    assert run_pack("--demo", "--quantize", "nvfp4", "--name", name) == 2
    captured = capsys.readouterr()
    assert "CUDA only" in captured.err and "--checkpoint DIR --quantize nvfp4" in captured.err
    assert "calibrating" not in captured.err + captured.out


def test_int4_awq_of_the_tiny_demo_names_the_size_that_fits(
    name: str, unchanged_store, capsys
) -> None:
    assert run_pack("--demo", "--quantize", "int4_awq", "--calib-size", "1", "--name", name) == 2
    error = capsys.readouterr().err
    assert "blocks of 128 input features" in error and "--demo-size awq" in error


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--demo", "--kv-cache-dtype", "fp8"), "go with --quantize"),
        (("--demo", "--calib-size", "8"), "go with --quantize"),
        (("--synthetic", "--quantize", "fp8"), "quantizes a Hugging Face checkpoint"),
        (("--demo-vlm", "--quantize", "fp8"), "quantizes a Hugging Face checkpoint"),
    ],
)
def test_quantize_options_out_of_place_are_refused(
    args: tuple[str, ...], message: str, name: str, unchanged_store, capsys
) -> None:
    assert run_pack(*args, "--name", name) == 2
    assert message in capsys.readouterr().err


def test_a_quantized_checkpoint_is_not_quantized_again(
    demo_checkpoint: Path, tmp_path: Path, name: str, unchanged_store, capsys
) -> None:
    quantized = shutil.copytree(demo_checkpoint, tmp_path / "fp8")
    (quantized / "hf_quant_config.json").write_text(
        json.dumps({"quantization": {"quant_algo": "FP8"}})
    )
    assert run_pack("--hf-model", str(quantized), "--quantize", "fp8", "--name", name) == 2
    assert "is quantized already (FP8 (hf_quant_config.json))" in capsys.readouterr().err


def test_without_modelopt_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, name: str, unchanged_store, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "modelopt", None)  # as if it were not installed
    assert run_pack("--demo", "--quantize", "fp8", "--name", name) == 2
    error = capsys.readouterr().err
    assert "--quantize needs NVIDIA ModelOpt" in error
    assert "pip install --no-deps nvidia-modelopt==0.47.0" in error


def test_nvfp4_is_quantized_for_blackwell_and_refused_for_hopper_before_calibrating(
    demo_checkpoint: Path, name: str, unchanged_store, capsys
) -> None:
    """ModelOpt exports NVFP4 on a CPU too; TensorRT-LLM runs it on Blackwell only."""
    args = ("--checkpoint", str(demo_checkpoint), "--quantize", "nvfp4", "--name", name)
    assert run_pack(*args, "--gpu-type", "nvidia-h100-80gb") == 2
    captured = capsys.readouterr()
    assert "NVFP4 needs a GPU of compute capability 10.0" in captured.err
    assert "quantized:" not in captured.out
    assert run_pack(*args, "--gpu-type", "nvidia-b200", "--calib-size", "2", "--dry-run") == 0
    assert "quantization: NVFP4, group size 16 (hf_quant_config.json)" in capsys.readouterr().out
