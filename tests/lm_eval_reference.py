"""lm-evaluation-harness's answers computed directly with transformers (float32, on the CPU): the
reference tests/integration/test_lm_eval.py holds lm-eval's answers through the service to.

lm-eval runs in a venv of its own (scripts/install-lm-eval.sh), so its definitions for causal
models are written out here, as lm-eval 0.4.13 has them:

- loglikelihood(context, continuation): trailing spaces of the context move to the continuation;
  the continuation's tokens are those of context + continuation past the context's own (both
  encoded without special tokens); an empty context is the prefix token (BOS, else EOS). The
  answer is the sum of the continuation tokens' log probs after the context, and whether every
  one of them is the most likely token there.
- loglikelihood_rolling(text): the text's tokens in disjoint windows of `max_length - 2` (its API
  models keep one position for generation and one for context); the first window is scored after
  the prefix token, each later one after the tokens before it that fit in `max_length - 1`.
- generate_until: greedy, at most `max_gen_toks` tokens, ended by EOS; the text is cut before the
  first stop string.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


def stored_checkpoint(model_root: Path) -> Path:
    """The Hugging Face checkpoint inside a model packed with --demo or --hf-model: `checkpoint/`
    (LLM API workflow) or the CPU engine's `engines/<checkpoint_dir>` (engine workflow)."""
    llmapi = model_root / "checkpoint"
    if (llmapi / "config.json").is_file():
        return llmapi
    config = json.loads((model_root / "engines" / "config.json").read_text(encoding="utf-8"))
    return model_root / "engines" / config["cpu_engine"]["checkpoint_dir"]


@dataclass(frozen=True)
class Scored:
    logprob: float
    is_greedy: bool


class Reference:
    """The model and tokenizer lm-eval is run against, loaded directly: the checkpoint as stored
    in the model store, the tokenizer the service was packed with."""

    def __init__(self, checkpoint: Path, tokenizer_dir: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint))
        self.model: Any = model.to(torch.float32).eval()
        bos, eos = self.tokenizer.bos_token_id, self.tokenizer.eos_token_id
        self.prefix_token: int = bos if bos is not None else eos
        self.eos_token: int = eos

    def encode(self, text: str, *, special: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    # -- scoring -------------------------------------------------------------------------------
    @torch.inference_mode()
    def score(self, tokens: Sequence[int], context_len: int) -> Scored:
        """The log prob of tokens[context_len:] after the tokens before them (context_len >= 1),
        and whether each is the argmax."""
        if not 1 <= context_len < len(tokens):
            raise ValueError(f"context_len {context_len} for {len(tokens)} tokens")
        logits = self.model(torch.tensor([list(tokens)])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        # Position i predicts token i + 1.
        targets = torch.tensor(tokens[context_len:])
        rows = logprobs[context_len - 1 : len(tokens) - 1]
        chosen = rows.gather(1, targets[:, None])[:, 0]
        greedy = bool((rows.argmax(dim=-1) == targets).all())
        return Scored(float(chosen.sum()), greedy)

    def pair_tokens(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's (context, continuation) tokens for a causal model."""
        if not context:
            tokens = self.encode(continuation)
            if tokens[0] == self.prefix_token:
                return tokens[:1], tokens[1:]
            return [self.prefix_token], tokens
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.encode(context + continuation)
        context_tokens = self.encode(context)
        return context_tokens, whole[len(context_tokens) :]

    def loglikelihood(self, context: str, continuation: str, max_length: int) -> Scored:
        context_tokens, continuation_tokens = self.pair_tokens(context, continuation)
        tokens = context_tokens + continuation_tokens
        if len(tokens) > max_length - 1:
            raise ValueError(f"{len(tokens)} tokens: lm-eval would cut the context to fit")
        return self.score(tokens, len(context_tokens))

    def loglikelihood_rolling(self, text: str, max_length: int) -> float:
        tokens = self.encode(text)
        span = max_length - 2
        windows = [([self.prefix_token], tokens[:span])]
        for start in range(span, len(tokens), span):
            end = min(start + span, len(tokens))
            windows.append((tokens[max(0, end - span - 1) : start], tokens[start:end]))
        return sum(self.score(before + scored, len(before)).logprob for before, scored in windows)

    # -- generation ----------------------------------------------------------------------------
    @torch.inference_mode()
    def greedy(self, prompt: Sequence[int], max_tokens: int, stop: Sequence[str]) -> str:
        """The greedy continuation of `prompt` (token ids), as the service answers it."""
        tokens = list(prompt)
        generated: list[int] = []
        for _ in range(max_tokens):
            logits = self.model(torch.tensor([tokens])).logits[0, -1]
            token = int(logits.argmax())
            if token == self.eos_token:
                break
            generated.append(token)
            tokens.append(token)
        text = str(self.tokenizer.decode(generated, skip_special_tokens=True))
        for word in stop:
            text = text.split(word)[0] if word else text
        return text

    def chat_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """The tokens /v1/chat/completions generates after: the chat template's text, encoded
        without special tokens (the template writes its own)."""
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return self.encode(str(text))
