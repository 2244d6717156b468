"""Build the demo checkpoints offline: a byte-level BPE tokenizer trained on the shipped corpus
and a tiny random-weight Llama, both loadable with AutoTokenizer / AutoModelForCausalLM; and, with
the same tokenizer plus an <image> token, a tiny random-weight LLaVA (a CLIP vision tower before
that Llama), loadable with AutoProcessor / AutoModelForImageTextToText (demo_qwen2vl.py builds
the Qwen2-VL family's demo the same way).

Nothing is downloaded, so tests and CI get a real transformers model in a few seconds.
Usage: python -m tensorrtllm_backend.packing.demo OUT_DIR [--vlm [FAMILY]] [--engine-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).with_name("corpus.txt")
VOCAB_SIZE = 2048
PAD, BOS, EOS = "<pad>", "<s>", "</s>"  # ids 0, 1, 2
SEED = 0

# Renders system/user/assistant turns; each turn ends with </s>. No BOS: the tokenizer's
# post-processor adds <s> when text is encoded with add_special_tokens=True. Tools, tool calls and
# tool results use the Hermes / Qwen format (<tools>, <tool_call>, <tool_response>), so the tool
# loop of the OpenAI API runs end to end on the demo model.
CHAT_TEMPLATE = (
    "{% if tools %}<|system|>\n"
    "You may call these functions. To call one, answer with "
    '<tool_call>{"name": <function name>, "arguments": <arguments object>}</tool_call>.\n'
    "<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>" + EOS + "\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and message.get('tool_calls') %}<|assistant|>\n"
    "{% if message['content'] %}{{ message['content'] }}\n{% endif %}"
    "{% for call in message['tool_calls'] %}"
    '<tool_call>\n{"name": {{ call["function"]["name"] | tojson }}, '
    '"arguments": {{ call["function"]["arguments"] | tojson }}}\n</tool_call>'
    "{% endfor %}" + EOS + "\n"
    "{% elif message['role'] == 'tool' %}"
    "<|tool|>\n<tool_response>\n{{ message['content'] }}\n</tool_response>" + EOS + "\n"
    "{% else %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}" + EOS + "\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


# The demo VLM's placeholder: the chat template writes one per image, the processor expands it
# into one per image feature: CLIP on 56 x 56 images in 14 x 14 patches gives 4 x 4 = 16 (its
# CLS feature dropped, vision_feature_select_strategy "default").
IMAGE_TOKEN = "<image>"
# The demo VLMs: this module's LLaVA, demo_qwen2vl.py's Qwen2-VL and Qwen2.5-VL.
VLM_FAMILIES = ("llava", "qwen2-vl", "qwen2.5-vl")
VLM_IMAGE_SIZE, VLM_PATCH_SIZE = 56, 14
VLM_IMAGE_TOKENS = (VLM_IMAGE_SIZE // VLM_PATCH_SIZE) ** 2
_VISION_TOWER = re.compile(r"(^|\.)vision_tower\.(?!vision_model\.)")


def vlm_chat_template(image: str) -> str:
    """CHAT_TEMPLATE, with a message's content either a string or a list of OpenAI-style parts:
    text parts render their text, image parts (chat's image / image_url, the Responses API's
    input_image) `image`, the model's markup for one image."""
    content_macro = (
        "{%- macro render_content(content) -%}"
        "{%- if content is string -%}{{ content }}"
        "{%- elif content is iterable -%}{%- for part in content -%}"
        "{%- if part['type'] in ('text', 'input_text', 'output_text') -%}{{ part['text'] }}"
        "{%- elif part['type'] in ('image', 'image_url', 'input_image') -%}"
        + image
        + "{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
        "{%- endmacro -%}"
    )
    return content_macro + CHAT_TEMPLATE.replace(
        "{{ message['content'] }}", "{{ render_content(message['content']) }}"
    )


VLM_CHAT_TEMPLATE = vlm_chat_template(IMAGE_TOKEN)


def _readable_by_transformers_4(out: Path, chat_template: str, **settings: object) -> None:
    """transformers 5 writes chat_template.jinja and names its own tokenizer class; older readers
    look for the template in tokenizer_config.json and know PreTrainedTokenizerFast."""
    config_file = out / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text(encoding="utf-8"))
    tokenizer_config["chat_template"] = chat_template
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config.update(settings)
    config_file.write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")


def train_tokenizer(corpus: Path = CORPUS, vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE: every UTF-8 string round-trips, multi-byte characters included."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(corpus)], trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


# Model shapes by --demo-size. "tiny" keeps tests fast; "awq" is the smallest whose linear layers
# take inputs of whole INT4 AWQ blocks (128: hidden 128, MLP 256), for quantizing with ModelOpt;
# "1b" has the layer shapes of a 1B Llama (hidden 2048, 16 layers, grouped-query attention 32/8
# heads, MLP 8192) with the demo's small vocabulary: ~0.9B random weights, to measure serving
# with real decoding work on a GPU.
DEMO_SIZES: dict[str, dict[str, int]] = {
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "awq": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
}


def demo_tokenizer(tokenizer: Any, **extra: Any) -> Any:
    """The demo's trained tokenizer as transformers' PreTrainedTokenizerFast (its special tokens,
    left padding, the demo's 2048 positions)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        padding_side="left",
        model_max_length=2048,
        **extra,
    )


def build_demo_checkpoint(out_dir: Path, size: str = "tiny") -> Path:
    """Write tokenizer + random-weight Llama (safetensors) into out_dir, deterministically.
    Returns out_dir. The 1b size is stored in bf16 (half the bytes to write)."""
    if size not in DEMO_SIZES:
        raise ValueError(f"demo size {size!r}: choose one of {', '.join(DEMO_SIZES)}")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_tokenizer = demo_tokenizer(train_tokenizer())
    hf_tokenizer.chat_template = CHAT_TEMPLATE
    hf_tokenizer.save_pretrained(str(out))
    _readable_by_transformers_4(out, CHAT_TEMPLATE)

    small = size != "1b"
    config = LlamaConfig(
        vocab_size=len(hf_tokenizer),
        **DEMO_SIZES[size],
        max_position_embeddings=2048,
        # small: peaked logits, so greedy ties are unlikely and outputs vary by prompt; the 1b
        # keeps the usual scale so its deep stack stays finite in bf16.
        initializer_range=0.2 if small else 0.02,
        bos_token_id=hf_tokenizer.bos_token_id,
        eos_token_id=hf_tokenizer.eos_token_id,
        pad_token_id=hf_tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    if small:
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    else:  # initialising ~1B weights is quicker on a GPU, where there is one
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(device):
            model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(str(out))
    return out


def _vision_tower_as_transformers_4_names_it(weights: Path) -> None:
    """transformers 5 saves LLaVA's CLIP tower as `vision_tower.<layer>`; transformers 4 loads it
    from `vision_tower.vision_model.<layer>` and would initialise it at random instead (the
    images' features then differ at every load). 5 loads either name: write 4's."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(weights), "pt") as reader:
        metadata = reader.metadata()
        tensors = {
            _VISION_TOWER.sub(r"\1vision_tower.vision_model.", key): reader.get_tensor(key)
            for key in reader.keys()
        }
    save_file(tensors, str(weights), metadata=metadata)


def build_demo_vlm_checkpoint(out_dir: Path) -> Path:
    """Write tokenizer (the demo's, plus IMAGE_TOKEN), processor and a random-weight LLaVA (a
    2-layer CLIP vision tower before the tiny demo Llama) into out_dir, deterministically, as
    transformers 5 writes them, readable by transformers 4.5x too (its image processor in
    preprocessor_config.json, its vision tower's weight names). Returns out_dir."""
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    tokenizer.add_special_tokens([IMAGE_TOKEN])
    hf_tokenizer = demo_tokenizer(tokenizer, extra_special_tokens={"image_token": IMAGE_TOKEN})
    hf_tokenizer.chat_template = VLM_CHAT_TEMPLATE
    image_token_id = hf_tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=VLM_IMAGE_SIZE,
            patch_size=VLM_PATCH_SIZE,
            projection_dim=32,
        ),
        text_config=LlamaConfig(
            vocab_size=len(hf_tokenizer),
            **DEMO_SIZES["tiny"],
            max_position_embeddings=2048,
            initializer_range=0.2,  # as the tiny demo: peaked logits, outputs vary by prompt
            bos_token_id=hf_tokenizer.bos_token_id,
            eos_token_id=hf_tokenizer.eos_token_id,
            pad_token_id=hf_tokenizer.pad_token_id,
            tie_word_embeddings=False,
        ),
        image_token_id=image_token_id,
        image_seq_length=VLM_IMAGE_TOKENS,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(SEED)
    model = LlavaForConditionalGeneration(config).to(torch.float32).eval()
    model.save_pretrained(str(out))
    _vision_tower_as_transformers_4_names_it(out / "model.safetensors")
    # CLIPImageProcessor runs on PIL where torchvision is missing (transformers says so once).
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": VLM_IMAGE_SIZE},
        crop_size={"height": VLM_IMAGE_SIZE, "width": VLM_IMAGE_SIZE},
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=hf_tokenizer,
        patch_size=VLM_PATCH_SIZE,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=VLM_CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(out))  # tokenizer, processor_config.json, chat_template.jinja
    image_processor.to_json_file(str(out / "preprocessor_config.json"))
    _readable_by_transformers_4(
        out, VLM_CHAT_TEMPLATE, extra_special_tokens={"image_token": IMAGE_TOKEN}
    )
    return out


def build_demo_vlm_family(out_dir: Path, family: str = "llava") -> Path:
    """The demo VLM of `family` (VLM_FAMILIES): the LLaVA here, or the Qwen2-VL or Qwen2.5-VL of
    demo_qwen2vl.py. Returns out_dir."""
    if family == "llava":
        return build_demo_vlm_checkpoint(out_dir)
    from .demo_qwen2vl import build_demo_qwen2vl_checkpoint

    return build_demo_qwen2vl_checkpoint(out_dir, family)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", type=Path, help="where to write the checkpoint")
    parser.add_argument(
        "--vlm",
        nargs="?",
        const="llava",
        choices=VLM_FAMILIES,
        help="the demo VLM instead, of this family (default: llava)",
    )
    parser.add_argument(
        "--engine-dir", type=Path, help="also write an hf-mode CPU engine dir packing it"
    )
    args = parser.parse_args(argv)
    ckpt = (
        build_demo_vlm_family(args.out_dir, args.vlm)
        if args.vlm
        else build_demo_checkpoint(args.out_dir)
    )
    print(f"demo checkpoint: {ckpt}")
    if args.engine_dir is not None:
        from ..common.cpu_engine_config import write_engine_dir

        model_config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
        language = model_config.get("text_config") or model_config  # a VLM nests its LM's
        write_engine_dir(
            args.engine_dir,
            mode="hf",
            checkpoint_dir=ckpt,
            vocab_size=language["vocab_size"],
            eos_token_id=language["eos_token_id"],
            architecture=model_config["architectures"][0],
        )
        print(f"CPU engine dir: {args.engine_dir}")


if __name__ == "__main__":
    main()
