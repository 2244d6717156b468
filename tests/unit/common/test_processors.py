"""load_processor: AutoProcessor's processor; where transformers' video processors cannot load
(no torchvision), a Qwen2-VL-family processor without its video processor, expanding images as
the class does; any other failure is AutoProcessor's own."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from PIL import Image
from transformers import AutoProcessor, Qwen2VLProcessor
from transformers.utils import is_torchvision_available

from tensorrtllm_backend.common.processors import load_processor
from tensorrtllm_backend.packing.demo import build_demo_vlm_checkpoint
from tensorrtllm_backend.packing.demo_qwen2vl import (
    QWEN2VL_IMAGE,
    build_demo_qwen2vl_checkpoint,
)


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_vlm_checkpoint(tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def qwen2vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_qwen2vl_checkpoint(tmp_path_factory.mktemp("qwen2vl"))


def test_a_processor_autoprocessor_loads_is_autoprocessors(llava: Path) -> None:
    assert type(load_processor(llava)) is type(AutoProcessor.from_pretrained(llava))


@pytest.mark.skipif(is_torchvision_available(), reason="AutoProcessor loads it as it is")
def test_without_torchvision_qwen2vl_loads_without_its_video_processor(qwen2vl: Path) -> None:
    with pytest.raises(ImportError, match="Torchvision"):
        AutoProcessor.from_pretrained(qwen2vl, local_files_only=True)
    processor = load_processor(qwen2vl)
    assert isinstance(processor, Qwen2VLProcessor)
    assert getattr(processor, "video_processor", None) is None
    # Qwen2VLProcessor's own expansion: one <|image_pad|> per 28 x 28 pixels of the resized image.
    encoded = processor(text=[QWEN2VL_IMAGE + "what?"], images=[Image.new("RGB", (100, 50))])
    assert encoded["input_ids"][0].count(processor.image_token_id) == 8
    assert encoded["mm_token_type_ids"][0].count(1) == 8


def test_other_import_errors_are_autoprocessors(llava: Path, monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise ImportError("some other library is missing")

    monkeypatch.setattr(AutoProcessor, "from_pretrained", fail)
    with pytest.raises(ImportError, match="some other library"):
        load_processor(llava)
