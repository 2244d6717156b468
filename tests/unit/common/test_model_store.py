"""The manifest's vision record as the service reads it: present for models that take images,
absent for text-only ones, refused when malformed."""

from __future__ import annotations

import pytest

from tensorrtllm_backend.common.model_store import ModelStoreError, vision_record

RECORD = {
    "architecture": "LlavaForConditionalGeneration",
    "model_type": "llava",
    "image_token": "<image>",
    "image_token_id": 2048,
}


def test_a_vlm_manifest_has_its_record() -> None:
    assert vision_record({"format": "bentotrtllm/1", "vision": RECORD}) == RECORD


def test_a_text_only_manifest_has_none() -> None:
    assert vision_record({"format": "bentotrtllm/1"}) is None


@pytest.mark.parametrize(
    "record",
    [
        "yes",
        {**RECORD, "image_token_id": "2048"},
        {**RECORD, "image_token_id": True},
        {key: value for key, value in RECORD.items() if key != "image_token"},
    ],
)
def test_a_malformed_record_is_an_error(record: object) -> None:
    with pytest.raises(ModelStoreError, match="vision must be an object"):
        vision_record({"vision": record})
