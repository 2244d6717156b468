"""Which checkpoints take images (vision_info's rule), what their record says, and the language
model's settings of a VLM's config.json (language_config)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tensorrtllm_backend.packing.checkpoint import (
    CheckpointError,
    describe_vision,
    language_config,
    vision_info,
)

DEMO_VLM_RECORD = {
    "architecture": "LlavaForConditionalGeneration",
    "model_type": "llava",
    "image_token": "<image>",
    "image_token_id": 2048,
}


def edited(source: Path, target: Path, **config_changes: object) -> Path:
    """A copy of checkpoint `source` whose config.json has the changes (None: key removed)."""
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    for key, value in config_changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_the_demo_vlm_takes_images(demo_vlm_checkpoint: Path) -> None:
    assert vision_info(demo_vlm_checkpoint) == DEMO_VLM_RECORD
    assert describe_vision(DEMO_VLM_RECORD) == [
        "images:       yes (LlavaForConditionalGeneration, <image>)"
    ]


def test_a_text_only_checkpoint_has_no_record(demo_checkpoint: Path) -> None:
    assert vision_info(demo_checkpoint) is None
    assert describe_vision(None) == []


def test_conditional_generation_alone_is_not_images(tmp_path, demo_checkpoint) -> None:
    """Whisper and T5 are ...ForConditionalGeneration too; Whisper ships a feature extractor."""
    whisper = edited(demo_checkpoint, tmp_path / "whisper",
                     architectures=["WhisperForConditionalGeneration"], model_type="whisper")  # fmt: skip
    (whisper / "preprocessor_config.json").write_text(
        json.dumps({"feature_extractor_type": "WhisperFeatureExtractor"})
    )
    assert vision_info(whisper) is None


def test_an_image_processor_without_vision_config_is_images(tmp_path, demo_vlm_checkpoint):
    """Models whose vision settings go by another name are told by their image processor."""
    other = edited(demo_vlm_checkpoint, tmp_path / "other", vision_config=None)
    assert vision_info(other) == DEMO_VLM_RECORD


def test_the_image_token_comes_from_the_tokenizer_without_an_id_in_config(
    tmp_path, demo_vlm_checkpoint
) -> None:
    no_id = edited(demo_vlm_checkpoint, tmp_path / "no-id", image_token_index=None)
    assert vision_info(no_id) == DEMO_VLM_RECORD


def test_a_vlm_without_its_processor_is_refused(tmp_path, demo_vlm_checkpoint) -> None:
    bare = edited(demo_vlm_checkpoint, tmp_path / "bare")
    for name in ("preprocessor_config.json", "processor_config.json"):
        (bare / name).unlink()
    with pytest.raises(CheckpointError, match="without its processor"):
        vision_info(bare)


def test_a_vlm_whose_image_token_the_tokenizer_lacks_is_refused(
    tmp_path, demo_vlm_checkpoint, demo_checkpoint
) -> None:
    """The image token must be one of the tokenizer's: here the text demo's, which has none."""
    vlm = edited(demo_vlm_checkpoint, tmp_path / "vlm", image_token_index=None)
    with pytest.raises(CheckpointError, match="no image token the tokenizer knows"):
        vision_info(vlm, tokenizer_dir=demo_checkpoint)


def test_language_settings_of_a_vlm_come_from_text_config() -> None:
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "vocab_size": 32000,  # stale top-level copy of transformers 4 checkpoints
        "text_config": {"vocab_size": 32064, "max_position_embeddings": 4096},
        "vision_config": {"hidden_size": 1024},
    }
    language = language_config(config)
    assert (language["vocab_size"], language["max_position_embeddings"]) == (32064, 4096)
    assert language["architectures"] == ["LlavaForConditionalGeneration"]
    assert language_config({"vocab_size": 7}) == {"vocab_size": 7}
