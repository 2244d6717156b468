"""pack_model.py end to end against the private model store (tests/conftest.py): every input error
exits 2 and stores nothing, --dry-run stores nothing, a real-format engine dir packs into the
documented layout, and a failure in the middle of storing leaves no model behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bentoml
import pytest
from engine_configs import modern_config

import pack_model
from tensorrtllm_backend.common.model_repository import parse_config
from tensorrtllm_backend.common.model_store import read_manifest
from tensorrtllm_backend.common.tokenization import load_tokenizer
from tensorrtllm_backend.packing import engine_packing as packing
from tensorrtllm_backend.packing.xgrammar_info import tokenizer_info
from tensorrtllm_backend.triton.localize import localize_repository

OLD_IMAGE = "nvcr.io/nvidia/tritonserver:24.03-trtllm-python-py3"  # TensorRT-LLM 0.8.0
MATCHING_IMAGE = "nvcr.io/nvidia/tritonserver:24.08-trtllm-python-py3"  # TensorRT-LLM 0.12.0


def write_engine_dir(path: Path, config: dict[str, Any] | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config or modern_config()))
    for rank in range(2):
        (path / f"rank{rank}.engine").write_bytes(os.urandom(4096))
    return path


@pytest.fixture
def engine_dir(tmp_path: Path) -> Path:
    return write_engine_dir(tmp_path / "engine")


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A model name no other test uses, so store checks see only this test's work."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[5:45].strip("-")
    return f"t-{slug}"


def stored_tags() -> set[str]:
    return {str(model.tag) for model in bentoml.models.list()}


def model_temp_dirs(name: str) -> list[Path]:
    """BentoML stages a model in $TMPDIR/bentoml-model-<name>-* before copying it to the store."""
    return list(Path(tempfile.gettempdir()).glob(f"bentoml-model-{name}-*"))


@pytest.fixture
def unchanged_store(name: str) -> Iterator[None]:
    """Asserts after the test that no model was added and no staging directory was left."""
    before = stored_tags()
    yield
    leftovers = stored_tags() - before
    for tag in leftovers:  # keep the session's store clean even when the check fails
        bentoml.models.delete(tag)
    assert leftovers == set()
    assert model_temp_dirs(name) == []


def run_pack(*args: str) -> int:
    return pack_model.main([*args, "--no-progress"])


@contextlib.contextmanager
def stored_model(name: str) -> Iterator[bentoml.Model]:
    """The one model stored under `name`, deleted from the store when the block ends."""
    (model,) = bentoml.models.list(name)
    try:
        yield model
    finally:
        bentoml.models.delete(str(model.tag))


# --- input errors: exit code 2, a message naming the problem, nothing stored --------------------


def test_missing_engine_dir(tmp_path, demo_checkpoint, name, unchanged_store, capsys) -> None:
    code = run_pack("--engine-dir", str(tmp_path / "nope"), "--tokenizer-dir",
                    str(demo_checkpoint), "--name", name)  # fmt: skip
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


def test_no_engine_files(tmp_path, demo_checkpoint, name, unchanged_store, capsys) -> None:
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text(json.dumps(modern_config()))
    assert run_pack("--engine-dir", str(engine), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", name) == 2  # fmt: skip
    assert "no *.engine files" in capsys.readouterr().err


def test_rank_file_missing(engine_dir, demo_checkpoint, name, unchanged_store, capsys) -> None:
    (engine_dir / "rank1.engine").unlink()
    assert run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", name) == 2  # fmt: skip
    assert "missing engine files for rank(s) [1]" in capsys.readouterr().err


def test_malformed_config(engine_dir, demo_checkpoint, name, unchanged_store, capsys) -> None:
    (engine_dir / "config.json").write_text('{"version": "0.12.0", "build_config": {')
    assert run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", name) == 2  # fmt: skip
    assert "is not valid JSON" in capsys.readouterr().err


def test_world_size_mismatch(engine_dir, demo_checkpoint, name, unchanged_store, capsys) -> None:
    (engine_dir / "config.json").write_text(json.dumps(modern_config(world_size=4)))
    assert run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", name) == 2  # fmt: skip
    assert "mapping.world_size is 4 but tp_size x pp_size = 2" in capsys.readouterr().err


def test_engine_without_tokenizer_dir(engine_dir, name, unchanged_store, capsys) -> None:
    assert run_pack("--engine-dir", str(engine_dir), "--name", name) == 2
    assert "--engine-dir needs --tokenizer-dir" in capsys.readouterr().err


def test_tokenizer_dir_without_tokenizer(engine_dir, tmp_path, name, unchanged_store, capsys):
    empty = tmp_path / "not-a-tokenizer"
    empty.mkdir()
    (empty / "README.md").write_text("weights only")
    assert run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(empty),
                    "--name", name) == 2  # fmt: skip
    assert "no tokenizer in" in capsys.readouterr().err


def test_tokenizer_dir_missing(engine_dir, tmp_path, name, unchanged_store, capsys) -> None:
    assert run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(tmp_path / "nope"),
                    "--name", name) == 2  # fmt: skip
    assert "does not exist" in capsys.readouterr().err


def test_version_mismatch_with_target_image(
    engine_dir, demo_checkpoint, name, unchanged_store, capsys
) -> None:
    assert run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", name, "--target-image", OLD_IMAGE) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "built by TensorRT-LLM 0.12.0" in err and "0.8.0" in err


def test_unknown_fill_key(engine_dir, demo_checkpoint, name, unchanged_store, capsys) -> None:
    assert run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", name, "--fill", "no_such_placeholder=1") == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "unknown option(s) no_such_placeholder" in err


def test_fill_without_value_separator(engine_dir, demo_checkpoint, name, unchanged_store, capsys):
    assert run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", name, "--fill", "gpu_device_ids") == 2  # fmt: skip
    assert "--fill expects KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "bad"),
    [(("--name", "My Model!"), "My Model!"), (("--name", "t-ok", "--tag", "v 1/x"), "v 1/x")],
    ids=["name", "tag"],
)
def test_invalid_model_name_or_tag(
    engine_dir, demo_checkpoint, unchanged_store, capsys, flags, bad
) -> None:
    """A name or version BentoML rejects fails like every other input error: exit 2, no trace."""
    code = run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    *flags)  # fmt: skip
    assert code == 2
    assert bad in capsys.readouterr().err


def test_hf_model_not_a_checkpoint(tmp_path, name, unchanged_store, capsys) -> None:
    assert run_pack("--hf-model", str(tmp_path), "--name", name) == 2
    assert "has no config.json" in capsys.readouterr().err


def test_dry_run_prints_summary_and_stores_nothing(
    engine_dir, demo_checkpoint, name, unchanged_store, capsys
) -> None:
    code = run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", name, "--dry-run", "--target-image", MATCHING_IMAGE)  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert f"model:        {name}" in out
    assert "tensorrt_llm (0.12.0), LlamaForCausalLM, float16, tp=2 pp=1" in out
    assert "max_input_len=2048 max_seq_len=4096" in out
    assert "triton_backend=tensorrtllm" in out
    assert "dry run: nothing stored" in out


# --- a real-format engine directory packs into the documented layout ----------------------------


@pytest.fixture
def packed(engine_dir: Path, demo_checkpoint: Path, name: str, capsys) -> bentoml.Model:
    code = run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", name, "--tag", "v1", "--target-image", MATCHING_IMAGE)  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"stored: {name}:v1" in out
    model = bentoml.models.get(f"{name}:v1")
    yield model
    bentoml.models.delete(str(model.tag))


def test_packed_engine_layout(packed: bentoml.Model, engine_dir: Path) -> None:
    root = Path(packed.path)
    engines = root / packing.ENGINES
    assert sorted(p.name for p in engines.iterdir()) == [
        "config.json",
        "rank0.engine",
        "rank1.engine",
    ]
    for rank in ("rank0.engine", "rank1.engine"):
        assert (engines / rank).read_bytes() == (engine_dir / rank).read_bytes()
    assert (root / packing.TOKENIZER / "tokenizer.json").is_file()
    assert not (root / packing.TOKENIZER / "model.safetensors").exists()  # tokenizer files only
    repository = root / packing.REPOSITORY
    assert {p.name for p in repository.iterdir()} >= {
        "ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls",
    }  # fmt: skip
    config = parse_config((repository / "tensorrt_llm" / "config.pbtxt").read_text())
    assert config.backend == "tensorrtllm"
    assert config.parameters["gpt_model_path"].string_value == "engines"  # relative: survives moves
    assert config.max_batch_size == 64
    tokenizer_dir = parse_config((repository / "preprocessing" / "config.pbtxt").read_text())
    assert tokenizer_dir.parameters["tokenizer_dir"].string_value == "tokenizer"
    assert str(root) not in (repository / "tensorrt_llm" / "config.pbtxt").read_text()
    # Guided decoding on the C++ backend: xgrammar over the stored tokenizer.
    assert config.parameters["guided_decoding_backend"].string_value == "xgrammar"
    assert config.parameters["tokenizer_dir"].string_value == "tokenizer"


def test_guided_decoding_can_be_turned_off(engine_dir, demo_checkpoint, name, capsys) -> None:
    code = run_pack(
        "--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
        "--name", name, "--guided-decoding-backend", "off", "--dry-run",
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "guided_decoding_backend=," in out
    assert "xgrammar_tokenizer_info_path" not in out  # no file for the C++ backend either


def test_cpp_backend_gets_the_xgrammar_tokenizer_file(packed: bentoml.Model, tmp_path) -> None:
    root = Path(packed.path)
    stored = parse_config((root / packing.REPOSITORY / "tensorrt_llm" / "config.pbtxt").read_text())
    value = stored.parameters["xgrammar_tokenizer_info_path"].string_value
    assert value == "tokenizer/xgrammar_tokenizer_info.json"  # relative: localized at start
    info = json.loads((root / value).read_text(encoding="utf-8"))
    assert info == tokenizer_info(load_tokenizer(root / packing.TOKENIZER))
    # The model served from elsewhere: the path resolves to the file of that copy.
    moved = Path(shutil.copytree(root, tmp_path / "served" / "model"))
    repository = localize_repository(moved / packing.REPOSITORY, tmp_path / "repo", moved)
    served = parse_config((repository / "tensorrt_llm" / "config.pbtxt").read_text())
    path = Path(served.parameters["xgrammar_tokenizer_info_path"].string_value)
    assert path == moved / value
    assert json.loads(path.read_text(encoding="utf-8")) == info


def test_guides_need_the_xgrammar_tokenizer_file_on_the_cpp_backend(
    packed: bentoml.Model, engine_dir, demo_checkpoint, capsys
) -> None:
    from tensorrtllm_backend.serving.runtime import LLMRuntime

    assert LLMRuntime(Path(packed.path))._guides_unsupported() is None
    # Left empty on purpose (as in a model packed without it): guided requests are refused.
    code = run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", packed.tag.name, "--tag", "v2", "--fill",
                    "xgrammar_tokenizer_info_path=")  # fmt: skip
    assert code == 0, capsys.readouterr().err
    without = bentoml.models.get(f"{packed.tag.name}:v2")
    try:
        assert not (Path(without.path) / packing.XGRAMMAR_TOKENIZER_INFO).exists()
        reason = LLMRuntime(Path(without.path))._guides_unsupported()
        assert reason is not None and "xgrammar_tokenizer_info_path" in reason
    finally:
        bentoml.models.delete(str(without.tag))


@pytest.fixture
def slow_tokenizer(tmp_path: Path) -> Path:
    """A real tokenizer with no tokenizer.json (ByT5's is pure Python)."""
    from transformers import ByT5Tokenizer

    ByT5Tokenizer().save_pretrained(tmp_path / "byt5")
    return tmp_path / "byt5"


def test_slow_tokenizer_turns_guided_decoding_off(engine_dir, slow_tokenizer, name, capsys) -> None:
    code = run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(slow_tokenizer),
                    "--name", name, "--dry-run")  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "warning: guided decoding turned off for this model" in captured.err
    assert "no tokenizer.json backend" in captured.err
    assert "guided_decoding_backend=," in captured.out
    assert "xgrammar_tokenizer_info_path" not in captured.out


def test_slow_tokenizer_with_guided_decoding_asked_is_an_error(
    engine_dir, slow_tokenizer, name, unchanged_store, capsys
) -> None:
    code = run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(slow_tokenizer),
                    "--name", name, "--guided-decoding-backend", "xgrammar")  # fmt: skip
    assert code == 2
    assert "--guided-decoding-backend xgrammar: the tokenizer" in capsys.readouterr().err


def test_packed_manifest_and_metadata(packed: bentoml.Model) -> None:
    manifest = read_manifest(Path(packed.path))
    assert manifest["source"] == "engine" and manifest["route"] == "direct"
    assert manifest["engine"]["version"] == "0.12.0"
    assert manifest["fill_options"]["triton_backend"] == "tensorrtllm"
    metadata = packed.info.metadata
    assert metadata["format"] == packing.FORMAT
    assert metadata["engine_kind"] == "tensorrt_llm"
    assert metadata["engine_world_size"] == 2
    assert metadata["engine_tp_size"] == 2
    assert metadata["engine_max_input_len"] == 2048
    assert metadata["engine_max_seq_len"] == 4096
    assert metadata["engine_max_batch_size"] == 64
    assert metadata["engine_version"] == "0.12.0"
    assert metadata["engine_architecture"] == "LlamaForCausalLM"
    assert packed.info.labels == {"engine": "tensorrt_llm", "source": "engine"}


def test_same_tag_twice_is_refused(packed, engine_dir, demo_checkpoint, name, capsys) -> None:
    code = run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", name, "--tag", "v1")  # fmt: skip
    assert code == 2
    assert "already exists" in capsys.readouterr().err
    assert bentoml.models.get(f"{name}:v1").path == packed.path


def test_stored_engine_files_are_hard_links_of_the_source(packed, engine_dir) -> None:
    """Same filesystem: the store holds hard links, no engine byte is copied."""
    source = os.stat(engine_dir / "rank0.engine")
    stored = os.stat(Path(packed.path) / packing.ENGINES / "rank0.engine")
    assert source.st_dev == stored.st_dev
    assert stored.st_ino == source.st_ino
    assert source.st_nlink >= 2


# --- atomicity: a failure while storing leaves nothing ------------------------------------------


def test_failure_while_writing_the_repository_stores_nothing(
    engine_dir, demo_checkpoint, name, unchanged_store, monkeypatch, capsys
) -> None:
    real_fill = packing.fill_repository
    calls: list[Path] = []

    def fill_then_fail(dst: Path, options: Any, **kwargs: Any) -> Path:
        calls.append(Path(dst))
        if len(calls) == 1:  # plan(): the validation fill in a scratch dir
            return real_fill(dst, options, **kwargs)
        raise OSError(28, "No space left on device")  # store(): engines already written

    monkeypatch.setattr(packing, "fill_repository", fill_then_fail)
    code = run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", name)  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and err.rstrip().endswith("nothing stored")
    assert len(calls) == 2
    assert (calls[1].parent / packing.ENGINES / "rank1.engine").exists() is False  # cleaned up


def test_interrupt_midway_stores_nothing(
    engine_dir, demo_checkpoint, name, unchanged_store, monkeypatch, capsys
) -> None:
    real_link = packing._link_or_copy
    copied: list[Path] = []

    def link_then_interrupt(src: Path, dst: Path, progress: Any) -> None:
        if copied:
            raise KeyboardInterrupt
        real_link(src, dst, progress)
        copied.append(dst)

    monkeypatch.setattr(packing, "_link_or_copy", link_then_interrupt)
    code = run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                    "--name", name)  # fmt: skip
    assert code == 130
    assert "interrupted, nothing stored" in capsys.readouterr().err
    assert len(copied) == 1


def test_dangling_rank_symlink_is_not_packed_silently(
    engine_dir, demo_checkpoint, name, capsys
) -> None:
    """Engines symlinked from storage that is not mounted: inspection counts rank1.engine, the
    copy skips it (not a regular file); the result must be an error, not a model without rank 1."""
    (engine_dir / "rank1.engine").unlink()
    (engine_dir / "rank1.engine").symlink_to(engine_dir.parent / "unmounted" / "rank1.engine")
    before = stored_tags()
    try:
        code = run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir", str(demo_checkpoint),
                        "--name", name)  # fmt: skip
        stored = stored_tags() - before
        assert (code, stored) == (2, set()), capsys.readouterr().out
    finally:
        for tag in stored_tags() - before:
            bentoml.models.delete(tag)


# --- CPU engine sources ---------------------------------------------------------------------------


def test_hf_model_packs_a_cpu_engine(demo_checkpoint: Path, name: str, capsys) -> None:
    code = run_pack("--hf-model", str(demo_checkpoint), "--name", name, "--max-input-len", "128",
                    "--max-seq-len", "256")  # fmt: skip
    assert code == 0, capsys.readouterr().err
    with stored_model(name) as model:
        root = Path(model.path)
        config = json.loads((root / packing.ENGINES / "config.json").read_text())
        assert config["cpu_engine"]["mode"] == "hf"
        checkpoint = root / packing.ENGINES / config["cpu_engine"]["checkpoint_dir"]
        assert (checkpoint / "model.safetensors").is_file()  # weights travel with the model
        tensorrt_llm = parse_config(
            (root / packing.REPOSITORY / "tensorrt_llm" / "config.pbtxt").read_text()
        )
        assert tensorrt_llm.backend == "python"
        # The CPU engine guides from tokenizer_dir: no file for NVIDIA's C++ backend.
        assert not tensorrt_llm.parameters["xgrammar_tokenizer_info_path"].string_value
        assert not (root / packing.XGRAMMAR_TOKENIZER_INFO).exists()
        assert model.info.metadata["engine_kind"] == "cpu"
        assert model.info.metadata["engine_max_input_len"] == 128
        assert model.info.labels["source"] == "hf"


def test_synthetic_packs_without_a_checkpoint(name: str, capsys) -> None:
    code = run_pack("--synthetic", "--itl-ms", "5", "--name", name, "--route", "ensemble")
    assert code == 0, capsys.readouterr().err
    with stored_model(name) as model:
        root = Path(model.path)
        config = json.loads((root / packing.ENGINES / "config.json").read_text())
        assert config["cpu_engine"]["mode"] == "synthetic"
        assert config["cpu_engine"]["itl_ms"] == 5.0
        assert (root / packing.TOKENIZER / "tokenizer.json").is_file()
        assert read_manifest(root)["route"] == "ensemble"
        assert model.info.metadata["engine_cpu_mode"] == "synthetic"


def test_engines_answer_images_with_the_workflow_that_takes_them(packed: bentoml.Model) -> None:
    from tensorrtllm_backend.serving.runtime import LLMRuntime

    reason = LLMRuntime(Path(packed.path)).images_unsupported
    assert reason is not None and "LLM API workflow" in reason and "--checkpoint" in reason
