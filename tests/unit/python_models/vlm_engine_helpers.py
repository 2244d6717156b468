"""Shared helpers for the CPU engine's vision-language tests: small test images, a one-turn
chat prompt with them as the model's processor builds it, and transformers' own greedy answer
(the reference the engine's tokens must equal)."""

from __future__ import annotations

import io

from cpu_engine_helpers import make_request, run_on
from PIL import Image

QUESTION = "What is in the picture?"


def png(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    buffer = io.BytesIO()
    image = Image.new("RGB", size, color)
    image.putpixel((3, 4), (255 - color[0], 17, 99))
    image.save(buffer, "PNG")
    return buffer.getvalue()


def prompt_with(processor, images: list[bytes], text: str = QUESTION) -> tuple[list[int], dict]:
    """The chat prompt of one user turn with these images, expanded, and the processor's
    tensors (the reference's input)."""
    content = [{"type": "image"}] * len(images) + [{"type": "text", "text": text}]
    chat = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    encoded = processor(text=[chat], images=pil or None, add_special_tokens=False,
                        return_tensors="pt")  # fmt: skip
    return encoded["input_ids"][0].tolist(), encoded


def reference_greedy(model, encoded: dict, n: int) -> list[int]:
    out = model.generate(**encoded, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, encoded["input_ids"].shape[1] :].tolist()


def assert_images_go_in_order(backend, processor, first: bytes, second: bytes) -> None:
    """Two images in one prompt, then swapped: each answer is transformers' for its order."""
    ids, encoded = prompt_with(processor, [first, second])
    swapped, encoded_swapped = prompt_with(processor, [second, first])
    got = run_on(backend, [make_request(ids, 4, images=[first, second], min_tokens=4, end_id=2),
                        make_request(swapped, 4, images=[second, first], min_tokens=4, end_id=2)])  # fmt: skip
    assert got == [
        reference_greedy(backend.model, encoded, 4),
        reference_greedy(backend.model, encoded_swapped, 4),
    ]
