"""A thinking test model: it writes `<think>…</think>` and then an answer, through the real
CPU engine (hf mode) and its real xgrammar masking.

A random-weight model never closes a think block, so this one is wired, not trained:

* the tokenizer is the demo's, with `<think>` and `</think>` added as tokens (as DeepSeek-R1 and
  Qwen3 have them: not special, so they stay in the decoded text), and a chat template whose
  generation prompt opens a think block, or closes an empty one when `enable_thinking` is false
  (Qwen3's convention; the service recognises the template as `qwen3`);
* the model is a Llama whose layers add nothing (their output projections are zero), so its
  logits depend on the last token only: a bigram model. The embeddings of the tokens it writes
  are orthogonal and the output matrix maps each to its successor with a logit of
  :data:`FAVOURITE` (every other logit of those tokens is 0), so after the thinking prompt it
  writes :data:`THINKING`, `</think>`, :data:`ANSWER` and its end token, at any temperature up to 2
  practically for sure; after the closed prompt it writes :data:`ANSWER` at once.

Under a guide the favourite may be masked out; the model then picks among the allowed tokens,
all equally likely (greedy: the lowest id), as a model with no opinion would. The thinking text
is chosen so that no JSON grammar allows it: a guide enforced from the first token would change
it, a guide enforced after the thinking leaves it as written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

THINKING = "Let me see: {is it] right? Sure!"
ANSWER = "The answer is yes."
FAVOURITE = 60.0
THINK_TEMPLATE_END = (
    "{% if add_generation_prompt %}<|assistant|>\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>{% endif %}{% endif %}"
)
MESSAGES = [{"role": "user", "content": "Is it?"}]


def _template() -> str:
    from tensorrtllm_backend.packing.demo import CHAT_TEMPLATE

    plain_end = "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    assert CHAT_TEMPLATE.endswith(plain_end)
    return CHAT_TEMPLATE[: -len(plain_end)] + THINK_TEMPLATE_END


def thinking_tokenizer() -> Any:
    """The demo tokenizer with the think tokens and the thinking template."""
    from transformers import PreTrainedTokenizerFast

    from tensorrtllm_backend.packing.demo import BOS, EOS, PAD, train_tokenizer

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(), bos_token=BOS, eos_token=EOS, pad_token=PAD
    )
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = _template()
    return tokenizer


def _chains(tokenizer: Any) -> list[list[int]]:
    """The token sequences the model writes, each after the last token of one prompt."""

    def tail(**kwargs: Any) -> int:
        prompt = tokenizer.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=True, **kwargs
        )
        return int(tokenizer.encode(prompt, add_special_tokens=False)[-1])

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    end = tokenizer.convert_tokens_to_ids("</think>")
    answer = [*encode(ANSWER), tokenizer.eos_token_id]
    return [
        [tail(), *encode(THINKING), end, *answer],
        [tail(enable_thinking=False), *answer],
    ]


def successors(chains: list[list[int]]) -> dict[int, int]:
    """Each written token's successor; a token with two different ones cannot be wired."""
    following: dict[int, int] = {}
    for chain in chains:
        for current, nxt in zip(chain, chain[1:], strict=False):
            if following.setdefault(current, nxt) != nxt:
                raise ValueError(f"token {current} would need two successors")
    return following


def build_thinking_checkpoint(out_dir: Path) -> Path:
    """Tokenizer and bigram Llama (safetensors) in `out_dir`, loadable with the Auto classes."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = thinking_tokenizer()
    following = successors(_chains(tokenizer))
    written = sorted(set(following) | set(following.values()))
    hidden = 128
    assert len(written) <= hidden, "more written tokens than orthogonal directions"
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # layers add nothing: the last token alone decides
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        # Written tokens get orthogonal embeddings of unit RMS (what the final norm leaves).
        basis, _ = torch.linalg.qr(torch.randn(hidden, hidden))
        embeddings = model.model.embed_tokens.weight
        head = model.lm_head.weight
        head.zero_()
        for row, token in enumerate(written):
            embeddings[token] = basis[:, row] * hidden**0.5
        for current, nxt in following.items():
            head[nxt] += embeddings[current] * (FAVOURITE / hidden)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    config_file = out / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text(encoding="utf-8"))
    tokenizer_config["chat_template"] = tokenizer.chat_template
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    return out
