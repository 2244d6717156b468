# ruff: noqa: F811  (fixtures shared with test_pack_model are imported, then requested)
"""The demo Qwen2-VL and Qwen2.5-VL: built offline, loaded as a download is (AutoProcessor, here
without its video processor where torchvision is missing, and AutoModelForImageTextToText),
their chat template writing Qwen2-VL's image markup that the processor expands by the image's
size, detected as vision-language models, and packed by `--demo-vlm --demo-vlm-family`."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_pack_model import name, run_pack, unchanged_store  # noqa: F401
from transformers import AutoModelForImageTextToText

from tensorrtllm_backend.common.processors import load_processor
from tensorrtllm_backend.packing.checkpoint import vision_info
from tensorrtllm_backend.packing.demo_qwen2vl import (
    FAMILIES,
    IMAGE_PAD,
    QWEN2VL_IMAGE,
    build_demo_qwen2vl_checkpoint,
)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def checkpoint(family: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_qwen2vl_checkpoint(tmp_path_factory.mktemp(family) / "checkpoint", family)


def test_it_loads_as_a_download_does(family: str, checkpoint: Path) -> None:
    _, model_class, processor_class = FAMILIES[family]
    model = AutoModelForImageTextToText.from_pretrained(checkpoint, local_files_only=True)
    assert type(model).__name__ == model_class
    processor = load_processor(checkpoint)
    assert type(processor).__name__ == processor_class
    assert processor.tokenizer.convert_ids_to_tokens(model.config.image_token_id) == IMAGE_PAD


@pytest.mark.parametrize(("size", "tokens"), [((40, 30), 6), ((100, 50), 8), ((400, 400), 16)])
def test_an_image_makes_tokens_by_its_size(checkpoint: Path, size, tokens: int) -> None:
    """Resized to multiples of 28 pixels within 56 x 56 and 112 x 112: a token per 28 x 28."""
    processor = load_processor(checkpoint)
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}],
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    assert prompt.count(QWEN2VL_IMAGE) == 1
    image = Image.fromarray(np.zeros((size[1], size[0], 3), np.uint8))
    encoded = processor(text=[prompt], images=[image], add_special_tokens=False)
    assert encoded["input_ids"][0].count(processor.image_token_id) == tokens


def test_it_is_detected_as_a_vision_language_model(family: str, checkpoint: Path) -> None:
    record = vision_info(checkpoint)
    assert record is not None
    assert record["architecture"] == FAMILIES[family][1]
    assert record["image_token"] == IMAGE_PAD


def test_it_is_built_deterministically(family: str, checkpoint: Path, tmp_path: Path) -> None:
    again = build_demo_qwen2vl_checkpoint(tmp_path / "again", family)
    for file in ("model.safetensors", "tokenizer.json", "preprocessor_config.json"):
        digests = {hashlib.sha256((d / file).read_bytes()).digest() for d in (checkpoint, again)}
        assert len(digests) == 1, file


@pytest.mark.parametrize("family", list(FAMILIES))
def test_pack_model_packs_it(family: str, name, unchanged_store, capsys) -> None:
    assert run_pack("--demo-vlm", "--demo-vlm-family", family, "--dry-run") == 0
    out = capsys.readouterr().out
    assert f"model:        trtllm-demo-{family}" in out
    assert f"images:       yes ({FAMILIES[family][1]}, {IMAGE_PAD})" in out


def test_the_family_needs_demo_vlm(name, unchanged_store, capsys) -> None:
    assert run_pack("--demo", "--demo-vlm-family", "qwen2-vl", "--dry-run") == 2
    assert "--demo-vlm-family" in capsys.readouterr().err
