"""Build the demo Qwen2-VL offline: the demo's byte-level BPE tokenizer plus Qwen2-VL's vision
tokens, its image processor (small pixel bounds, so an image makes a handful of tokens) and a
tiny random-weight Qwen2-VL or Qwen2.5-VL (a 2-block vision tower with its 2 x 2 patch merger
before a 2-layer language model with multimodal rotary positions, M-RoPE), loadable with
AutoProcessor / AutoModelForImageTextToText.

Unlike the demo LLaVA, an image's token count depends on its size (the processor resizes it to
multiples of 28 pixels within the bounds, one token per 28 x 28), and the positions the language
model rotates by are 3-D: the family the CPU stand-in serves with `get_rope_index`'s positions.
"""

from __future__ import annotations

import json
from pathlib import Path

from .demo import (
    DEMO_SIZES,
    SEED,
    _readable_by_transformers_4,
    demo_tokenizer,
    train_tokenizer,
    vlm_chat_template,
)

VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD = (
    "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>",
)  # fmt: skip
# The chat template writes one image as Qwen2-VL's templates do; the processor expands its
# <|image_pad|> into one per image token.
QWEN2VL_IMAGE = VISION_START + IMAGE_PAD + VISION_END
QWEN2VL_CHAT_TEMPLATE = vlm_chat_template(QWEN2VL_IMAGE)
# 14-pixel patches merged 2 x 2: an image token per 28 x 28 pixels. Between 56 x 56 and
# 112 x 112 pixels: 4 to 16 image tokens.
PATCH_SIZE, MERGE_SIZE = 14, 2
MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112
# The two members of the family: their config, model and processor classes and architecture.
FAMILIES = {
    "qwen2-vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", "Qwen2VLProcessor"),
    "qwen2.5-vl": (
        "Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor",
    ),
}  # fmt: skip


def _vision_config(family: str, hidden_size: int) -> dict[str, object]:
    """A tiny vision tower whose merger outputs the language model's width."""
    shared = {
        "depth": 2,
        "num_heads": 2,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": 2,
    }
    if family == "qwen2-vl":
        return {**shared, "embed_dim": 32, "mlp_ratio": 2, "hidden_size": hidden_size}
    # Qwen2.5-VL: windowed attention in block 0 (56-pixel windows: 2 x 2 image tokens each) and
    # full attention in block 1, as its larger towers alternate them.
    return {
        **shared,
        "hidden_size": 32,
        "intermediate_size": 64,
        "out_hidden_size": hidden_size,
        "window_size": 56,
        "fullatt_block_indexes": [1],
        "tokens_per_second": 2,
    }


def image_processor_settings(processor_class: str) -> dict[str, object]:
    """preprocessor_config.json as Qwen2-VL's downloads ship it (transformers 4 reads min_pixels
    and max_pixels, 5 the size's edges; both mean the same bounds). Its `processor_class` tells
    AutoProcessor which processor to build."""
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": processor_class,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_convert_rgb": True,
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": 2,
        "merge_size": MERGE_SIZE,
    }


def build_demo_qwen2vl_checkpoint(out_dir: Path, family: str = "qwen2-vl") -> Path:
    """Write tokenizer (the demo's, plus Qwen2-VL's vision tokens), image processor and chat
    template, and a random-weight Qwen2-VL (`family` "qwen2-vl") or Qwen2.5-VL ("qwen2.5-vl")
    into out_dir, deterministically. Returns out_dir."""
    if family not in FAMILIES:
        raise ValueError(f"demo VLM family {family!r}: choose one of {', '.join(FAMILIES)}")
    import torch
    import transformers

    config_name, model_name, processor_name = FAMILIES[family]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    tokenizer.add_special_tokens([VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD])
    extra = {
        "image_token": IMAGE_PAD,
        "video_token": VIDEO_PAD,
        "vision_start_token": VISION_START,
        "vision_end_token": VISION_END,
    }
    hf_tokenizer = demo_tokenizer(tokenizer, extra_special_tokens=extra)
    hf_tokenizer.chat_template = QWEN2VL_CHAT_TEMPLATE
    hf_tokenizer.save_pretrained(str(out))  # tokenizer files and chat_template.jinja
    _readable_by_transformers_4(out, QWEN2VL_CHAT_TEMPLATE, extra_special_tokens=extra)
    ids = {token: hf_tokenizer.convert_tokens_to_ids(token) for token in extra.values()}
    tiny = DEMO_SIZES["tiny"]
    head_dim = tiny["hidden_size"] // tiny["num_attention_heads"]
    # M-RoPE: of each head's head_dim / 2 rotary frequencies, the first rotate by the temporal
    # position, the next by the height, the last by the width (Qwen2-VL's 16/24/24 of 64).
    sections = [head_dim // 8, head_dim * 3 // 16, head_dim * 3 // 16]
    config = getattr(transformers, config_name)(
        text_config={
            "vocab_size": len(hf_tokenizer),
            **tiny,
            "max_position_embeddings": 2048,
            "initializer_range": 0.2,  # as the tiny demo: peaked logits, outputs vary by prompt
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": sections,
            },
            "bos_token_id": hf_tokenizer.bos_token_id,
            "eos_token_id": hf_tokenizer.eos_token_id,
            "pad_token_id": hf_tokenizer.pad_token_id,
        },
        vision_config=_vision_config(family, tiny["hidden_size"]),
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    model = getattr(transformers, model_name)(config).to(torch.float32).eval()
    model.save_pretrained(str(out))
    settings = image_processor_settings(processor_name)
    (out / "preprocessor_config.json").write_text(
        json.dumps(settings, indent=2) + "\n", encoding="utf-8"
    )
    return out
