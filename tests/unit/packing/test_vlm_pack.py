# ruff: noqa: F811  (fixtures shared with test_pack_model are imported, then requested)
"""pack_model.py packs vision-language models: --demo-vlm for both workflows, an
image-text-to-text --hf-model or --checkpoint. Their manifest records `vision`, their processor is
stored beside the tokenizer (where AutoProcessor loads it as the service will), and text-only
models and --engine-dir engines record nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from test_pack_model import (  # noqa: F401
    engine_dir,
    name,
    run_pack,
    stored_model,
    unchanged_store,
)
from transformers import AutoModelForImageTextToText, AutoProcessor

from tensorrtllm_backend.common.model_store import (
    ENGINES,
    TOKENIZER,
    read_manifest,
    vision_record,
)
from tensorrtllm_backend.packing.demo import VLM_IMAGE_TOKENS

RECORD = {
    "architecture": "LlavaForConditionalGeneration",
    "model_type": "llava",
    "image_token": "<image>",
    "image_token_id": 2048,
}
IMAGES_LINE = "images:       yes (LlavaForConditionalGeneration, <image>)"
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "chat_template.jinja")
# What transformers 5 saves of a processor (the demo adds preprocessor_config.json for 4.x).
SAVED_PROCESSOR_FILES = PROCESSOR_FILES[1:]


def assert_processor_loads(tokenizer_dir: Path, files: tuple[str, ...] = PROCESSOR_FILES) -> None:
    """The service's load: AutoProcessor from the stored tokenizer directory (holding `files`),
    expanding the chat template's placeholder into the image's feature positions."""
    for file in files:
        assert (tokenizer_dir / file).is_file(), file
    processor = AutoProcessor.from_pretrained(tokenizer_dir, local_files_only=True)
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}],
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    image = Image.fromarray(np.zeros((30, 50, 3), np.uint8))
    ids = processor(text=prompt, images=[image])["input_ids"][0]
    assert list(ids).count(RECORD["image_token_id"]) == VLM_IMAGE_TOKENS


def test_demo_vlm_dry_run(name, unchanged_store, capsys) -> None:
    assert run_pack("--demo-vlm", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "model:        trtllm-demo-vlm" in out
    assert "engine:       cpu (hf), LlavaForConditionalGeneration" in out
    assert IMAGES_LINE in out and "dry run: nothing stored" in out


def test_demo_vlm_dry_run_llmapi(name, unchanged_store, capsys) -> None:
    assert run_pack("--demo-vlm", "--workflow", "llmapi", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "model:        trtllm-llmapi-demo-vlm" in out
    assert IMAGES_LINE in out and "max_seq_len=2048" in out  # text_config's positions


def test_demo_vlm_packs_the_cpu_engine(name, capsys) -> None:
    code = run_pack("--demo-vlm", "--name", name, "--max-input-len", "128", "--max-seq-len", "256")
    assert code == 0, capsys.readouterr().err
    with stored_model(name) as model:
        root = Path(model.path)
        manifest = read_manifest(root)
        assert manifest["vision"] == vision_record(manifest) == RECORD
        assert manifest["source"] == "demo" and model.info.labels["source"] == "demo"
        engine = json.loads((root / ENGINES / "config.json").read_text())
        assert engine["cpu_engine"]["mode"] == "hf"
        assert engine["pretrained_config"]["vocab_size"] == 2049  # text_config's
        checkpoint = root / ENGINES / engine["cpu_engine"]["checkpoint_dir"]
        assert (checkpoint / "processor_config.json").is_file()
        assert type(AutoModelForImageTextToText.from_pretrained(checkpoint)).__name__ == (
            "LlavaForConditionalGeneration"
        )
        assert_processor_loads(root / TOKENIZER)


def test_demo_vlm_packs_the_llmapi_model(name, capsys) -> None:
    code = run_pack("--demo-vlm", "--workflow", "llmapi", "--name", name)
    assert code == 0, capsys.readouterr().err
    with stored_model(name) as model:
        root = Path(model.path)
        manifest = read_manifest(root)
        assert vision_record(manifest) == RECORD
        assert (manifest["workflow"], manifest["source"]) == ("llmapi", "demo")
        assert model.info.metadata["engine_kind"] == "cpu"
        settings = yaml.safe_load(
            (root / "model_repository" / "tensorrt_llm" / "1" / "model.yaml").read_text()
        )
        assert settings["model"] == "checkpoint"
        assert manifest["limits"]["max_seq_len"] == 2048  # text_config's positions
        for file in ("model.safetensors", "config.json", *PROCESSOR_FILES):
            assert (root / "checkpoint" / file).is_file(), file
        assert_processor_loads(root / TOKENIZER)


@pytest.fixture(scope="module")
def saved_vlm(demo_vlm_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo VLM as transformers itself saves a loaded one (a download's layout): processor
    in processor_config.json only, transformers 5's tokenizer class."""
    path = tmp_path_factory.mktemp("saved") / "Tiny-Llava"
    AutoModelForImageTextToText.from_pretrained(demo_vlm_checkpoint).save_pretrained(path)
    AutoProcessor.from_pretrained(demo_vlm_checkpoint).save_pretrained(path)
    assert not (path / "preprocessor_config.json").exists()
    return path


def test_hf_model_of_a_vlm(saved_vlm: Path, capsys) -> None:
    code = run_pack("--hf-model", str(saved_vlm))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert IMAGES_LINE in out
    with stored_model("trtllm-tiny-llava") as model:
        root = Path(model.path)
        assert vision_record(read_manifest(root)) == RECORD
        assert_processor_loads(root / TOKENIZER, SAVED_PROCESSOR_FILES)


def test_checkpoint_of_a_vlm_tensorrt_llm_runs(saved_vlm: Path, tmp_path, name, capsys) -> None:
    """--checkpoint (the LLM API on GPUs) takes VLM architectures TensorRT-LLM implements; the
    record names the checkpoint's."""
    checkpoint = shutil.copytree(saved_vlm, tmp_path / "llava-next")
    config = json.loads((checkpoint / "config.json").read_text())
    config["architectures"] = ["LlavaNextForConditionalGeneration"]
    (checkpoint / "config.json").write_text(json.dumps(config))
    code = run_pack("--checkpoint", str(checkpoint), "--name", name)
    assert code == 0, capsys.readouterr().err
    with stored_model(name) as model:
        root = Path(model.path)
        manifest = read_manifest(root)
        assert vision_record(manifest) == {
            **RECORD, "architecture": "LlavaNextForConditionalGeneration"
        }  # fmt: skip
        assert manifest["checkpoint"]["max_position_embeddings"] == 2048
        assert manifest["checkpoint"]["vocab_size"] == 2049
        assert model.info.metadata["engine_kind"] == "llmapi"
        assert_processor_loads(root / TOKENIZER, SAVED_PROCESSOR_FILES)


def test_checkpoint_of_a_vlm_tensorrt_llm_lacks_is_refused(
    demo_vlm_checkpoint, name, unchanged_store, capsys
) -> None:
    assert run_pack("--checkpoint", str(demo_vlm_checkpoint), "--name", name) == 2
    err = capsys.readouterr().err
    assert "'LlavaForConditionalGeneration' is not one TensorRT-LLM's PyTorch backend" in err


def test_a_vlm_without_processor_stores_nothing(
    demo_vlm_checkpoint, tmp_path, name, unchanged_store, capsys
) -> None:
    bare = shutil.copytree(demo_vlm_checkpoint, tmp_path / "bare")
    for file in ("preprocessor_config.json", "processor_config.json"):
        (bare / file).unlink()
    assert run_pack("--hf-model", str(bare), "--name", name) == 2
    assert "without its processor" in capsys.readouterr().err


def test_demo_size_is_the_text_demos(name, unchanged_store, capsys) -> None:
    assert run_pack("--demo-vlm", "--demo-size", "1b", "--dry-run") == 2
    assert "--demo-size sizes --demo" in capsys.readouterr().err


@pytest.mark.parametrize("workflow", ["engine", "llmapi"])
def test_a_text_only_demo_records_no_vision(workflow: str, name, capsys) -> None:
    code = run_pack("--demo", "--workflow", workflow, "--name", name)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "images:" not in out
    with stored_model(name) as model:
        root = Path(model.path)
        assert "vision" not in read_manifest(root)
        assert vision_record(read_manifest(root)) is None
        assert not (root / TOKENIZER / "processor_config.json").exists()


def test_engines_record_no_vision(engine_dir, demo_vlm_checkpoint, name, capsys) -> None:
    """TensorRT-LLM engines (--engine-dir) take text only, whatever tokenizer they come with."""
    code = run_pack("--engine-dir", str(engine_dir), "--tokenizer-dir",
                    str(demo_vlm_checkpoint), "--name", name)  # fmt: skip
    assert code == 0, capsys.readouterr().err
    with stored_model(name) as model:
        root = Path(model.path)
        assert vision_record(read_manifest(root)) is None
        assert not (root / TOKENIZER / "processor_config.json").exists()
