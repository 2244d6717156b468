"""Build the demo checkpoint offline: a byte-level BPE tokenizer trained on the shipped corpus and a
tiny random-weight Llama, both loadable with AutoTokenizer / AutoModelForCausalLM.

Nothing is downloaded, so tests and CI get a real transformers model in a few seconds.
Usage: python -m tensorrtllm_backend.packing.demo OUT_DIR [--engine-dir ENGINE_DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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


# Model shapes by --demo-size. "tiny" keeps tests fast; "1b" has the layer shapes of a 1B Llama
# (hidden 2048, 16 layers, grouped-query attention 32/8 heads, MLP 8192) with the demo's small
# vocabulary: ~0.9B random weights, to measure serving with real decoding work on a GPU.
DEMO_SIZES: dict[str, dict[str, int]] = {
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
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


def build_demo_checkpoint(out_dir: Path, size: str = "tiny") -> Path:
    """Write tokenizer + random-weight Llama (safetensors) into out_dir, deterministically.
    Returns out_dir. Sizes other than tiny are stored in bf16 (half the bytes to write)."""
    if size not in DEMO_SIZES:
        raise ValueError(f"demo size {size!r}: choose one of {', '.join(DEMO_SIZES)}")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        padding_side="left",
        model_max_length=2048,
    )
    hf_tokenizer.chat_template = CHAT_TEMPLATE
    hf_tokenizer.save_pretrained(str(out))
    # transformers 5 writes chat_template.jinja; older readers look in tokenizer_config.json.
    config_file = out / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text(encoding="utf-8"))
    tokenizer_config["chat_template"] = CHAT_TEMPLATE
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"  # known to transformers 4.x too
    config_file.write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")

    tiny = size == "tiny"
    config = LlamaConfig(
        vocab_size=len(hf_tokenizer),
        **DEMO_SIZES[size],
        max_position_embeddings=2048,
        # tiny: peaked logits, so greedy ties are unlikely and outputs vary by prompt; larger
        # models keep the usual scale so deep stacks stay finite in bf16.
        initializer_range=0.2 if tiny else 0.02,
        bos_token_id=hf_tokenizer.bos_token_id,
        eos_token_id=hf_tokenizer.eos_token_id,
        pad_token_id=hf_tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    if tiny:
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    else:  # initialising ~1B weights is quicker on a GPU, where there is one
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(device):
            model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", type=Path, help="where to write the checkpoint")
    parser.add_argument(
        "--engine-dir", type=Path, help="also write an hf-mode CPU engine dir packing it"
    )
    args = parser.parse_args(argv)
    ckpt = build_demo_checkpoint(args.out_dir)
    print(f"demo checkpoint: {ckpt}")
    if args.engine_dir is not None:
        from ..common.cpu_engine_config import write_engine_dir

        model_config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
        write_engine_dir(
            args.engine_dir,
            mode="hf",
            checkpoint_dir=ckpt,
            vocab_size=model_config["vocab_size"],
            eos_token_id=model_config["eos_token_id"],
        )
        print(f"CPU engine dir: {args.engine_dir}")


if __name__ == "__main__":
    main()
