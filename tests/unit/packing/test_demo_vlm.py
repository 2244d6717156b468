"""The demo vision-language model: a tiny LLaVA built offline that transformers loads as any
image-text-to-text download (AutoProcessor, AutoModelForImageTextToText), whose processor expands
each image placeholder of the chat template into the image's feature positions, and whose output
depends on every image it is given."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from tensorrtllm_backend.common.tokenization import load_tokenizer
from tensorrtllm_backend.packing.demo import (
    CHAT_TEMPLATE,
    IMAGE_TOKEN,
    VLM_CHAT_TEMPLATE,
    VLM_IMAGE_SIZE,
    VLM_IMAGE_TOKENS,
)

TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
TOOL_TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
        ],
    },
    {"role": "tool", "content": "sunny"},
]


def picture(seed: int, size: tuple[int, int] = (64, 80)) -> Image.Image:
    """A random RGB picture of another size than the model's: the processor resizes it."""
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture(scope="module")
def processor(demo_vlm_checkpoint: Path):
    return AutoProcessor.from_pretrained(demo_vlm_checkpoint, local_files_only=True)


@pytest.fixture(scope="module")
def model(demo_vlm_checkpoint: Path):
    return AutoModelForImageTextToText.from_pretrained(
        demo_vlm_checkpoint, local_files_only=True
    ).eval()


def two_image_prompt(processor) -> str:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare "},
                {"type": "image"},
                {"type": "text", "text": " with "},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},
            ],
        }
    ]
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_tokenizer_and_processor_both_carry_the_vlm_chat_template(demo_vlm_checkpoint) -> None:
    tokenizer = AutoTokenizer.from_pretrained(demo_vlm_checkpoint, local_files_only=True)
    processor = AutoProcessor.from_pretrained(demo_vlm_checkpoint, local_files_only=True)
    assert tokenizer.chat_template == processor.chat_template == VLM_CHAT_TEMPLATE
    assert load_tokenizer(demo_vlm_checkpoint).chat_template == VLM_CHAT_TEMPLATE
    # Readers older than transformers 5 find template and image processor where they look.
    tokenizer_config = json.loads((demo_vlm_checkpoint / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == VLM_CHAT_TEMPLATE
    assert (demo_vlm_checkpoint / "preprocessor_config.json").is_file()
    config = json.loads((demo_vlm_checkpoint / "config.json").read_text())
    assert config["image_seq_length"] == VLM_IMAGE_TOKENS
    assert config["text_config"]["vocab_size"] == len(tokenizer)


def test_string_contents_render_as_the_text_demo_does(demo_vlm_checkpoint) -> None:
    tokenizer = AutoTokenizer.from_pretrained(demo_vlm_checkpoint, local_files_only=True)

    def render(template: str) -> str:
        return tokenizer.apply_chat_template(
            TOOL_TURNS, tools=TOOLS, chat_template=template, tokenize=False,
            add_generation_prompt=True,
        )  # fmt: skip

    assert render(VLM_CHAT_TEMPLATE) == render(CHAT_TEMPLATE)
    assert "<tool_call>" in render(VLM_CHAT_TEMPLATE)


def test_content_parts_render_text_and_one_placeholder_per_image(demo_vlm_checkpoint) -> None:
    tokenizer = AutoTokenizer.from_pretrained(demo_vlm_checkpoint, local_files_only=True)
    parts = [
        {"type": "text", "text": "a"},
        {"type": "image"},
        {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
        {"type": "input_image", "image_url": "https://example.com/y.png"},
        {"type": "input_text", "text": "b"},
    ]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": parts}], tokenize=False, add_generation_prompt=True
    )
    assert text == f"<|user|>\na{IMAGE_TOKEN * 3}b</s>\n<|assistant|>\n"


def test_processor_expands_each_placeholder_into_the_images_features(processor) -> None:
    inputs = processor(
        text=two_image_prompt(processor), images=[picture(0), picture(1, (40, 40))],
        return_tensors="pt",
    )  # fmt: skip
    image_token_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert VLM_IMAGE_TOKENS == 16
    assert int((inputs["input_ids"] == image_token_id).sum()) == 2 * VLM_IMAGE_TOKENS
    assert tuple(inputs["pixel_values"].shape) == (2, 3, VLM_IMAGE_SIZE, VLM_IMAGE_SIZE)


def test_every_image_reaches_the_logits(processor, model) -> None:
    prompt = two_image_prompt(processor)

    def last_logits(*images: Image.Image) -> torch.Tensor:
        inputs = processor(text=prompt, images=list(images), return_tensors="pt")
        with torch.no_grad():
            return model(**inputs).logits[0, -1]

    a, b = picture(0), picture(1)
    both = last_logits(a, b)
    assert not torch.allclose(both, last_logits(b, b))  # the first image counts
    assert not torch.allclose(both, last_logits(a, a))  # and the second
    assert torch.equal(both, last_logits(a, b))  # deterministic


def test_the_vision_tower_has_the_weight_names_transformers_4_loads(demo_vlm_checkpoint) -> None:
    """Under 5's names transformers 4 would initialise the tower at random at every load."""
    from safetensors import safe_open

    with safe_open(str(demo_vlm_checkpoint / "model.safetensors"), "pt") as reader:
        tower = [key for key in reader.keys() if "vision_tower." in key]
    assert tower and all("vision_tower.vision_model." in key for key in tower)
