"""vLLM's `prompt_logprobs` of a scored prompt (completions per choice, chat per response)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..translation import PromptLogProbs

VllmPromptLogProbs = list[dict[str, dict[str, Any]] | None]


def vllm_prompt_logprobs(
    scores: PromptLogProbs, ids: list[int], k: int, strings: Callable[[list[int]], list[str]]
) -> VllmPromptLogProbs:
    """Null for the first token, then each token's entry (its log prob, rank and text) with the
    k most likely at its position, keyed by token id (`strings`: the text of token ids)."""
    alternatives = scores.top or [([], [])] * len(scores.log_probs)
    named = [i for top_ids, _ in alternatives for i in top_ids[:k]]
    texts = dict(zip(named + ids, strings(named + ids), strict=True))
    entries: VllmPromptLogProbs = [None]
    for token, value, rank, (top_ids, values) in zip(
        ids[1:], scores.log_probs, scores.ranks, alternatives, strict=True
    ):
        entry = {str(token): _entry(value, rank, texts[token])}
        for place, (i, lp) in enumerate(zip(top_ids[:k], values[:k], strict=True), start=1):
            entry.setdefault(str(i), _entry(lp, place, texts[i]))
        entries.append(entry)
    return entries


def _entry(log_prob: float, rank: int, text: str) -> dict[str, Any]:
    return {"logprob": log_prob, "rank": rank, "decoded_token": text}
