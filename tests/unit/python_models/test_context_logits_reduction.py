"""Prompt log probs reduced from context logits: numpy (host) and torch (device) agree with
log_softmax, block by block, for any k; so do the alternatives of the token after the prompt
(the last row); a short logits matrix is an error."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tensorrtllm_backend.python_models import prompt_scores  # noqa: E402
from tensorrtllm_backend.python_models.prompt_scores import (  # noqa: E402
    reduce_logits,
    reduce_next_token,
)

PROMPT = [3, 17, 0, 42, 42, 8, 63, 1]


@pytest.fixture
def logits() -> np.ndarray:
    return np.random.default_rng(7).normal(scale=3.0, size=(len(PROMPT), 64)).astype(np.float32)


def expected(logits: np.ndarray, k: int):
    table = torch.log_softmax(torch.from_numpy(logits), dim=-1)
    rows = range(len(PROMPT) - 1)
    own = [table[t, PROMPT[t + 1]].item() for t in rows]
    values, ids = torch.topk(table[:-1], k, dim=-1)
    ranks = [1 + int((table[t] > table[t, PROMPT[t + 1]]).sum()) for t in rows]
    return own, ids.numpy(), values.numpy(), ranks


@pytest.mark.parametrize("k", [0, 1, 5])
@pytest.mark.parametrize("as_torch", [False, True])
@pytest.mark.parametrize("block", [2, 256])
def test_scores_are_log_softmax_of_the_next_token(logits, k, as_torch, block, monkeypatch):
    monkeypatch.setattr(prompt_scores, "ROWS_PER_BLOCK", block)
    given = torch.from_numpy(logits)[None] if as_torch else logits[None]  # [1, L, V] too
    scores = reduce_logits(given, PROMPT, k)
    own, ids, values, ranks = expected(logits, k)
    assert scores.log_probs.tolist() == pytest.approx(own, abs=1e-5)
    assert scores.top_ids.shape == (len(PROMPT) - 1, k)
    assert (scores.top_ids == ids).all()
    assert scores.top_log_probs == pytest.approx(values, abs=1e-5)
    assert scores.ranks.tolist() == ranks


def test_a_one_token_prompt_has_no_scores(logits):
    scores = reduce_logits(logits[:1], PROMPT[:1], 3)
    assert scores.log_probs.shape == (0,) and scores.top_ids.shape == (0, 3)


def test_logits_for_fewer_tokens_than_the_prompt_are_an_error(logits):
    with pytest.raises(ValueError, match="5 of the prompt's 8 tokens"):
        reduce_logits(logits[:5], PROMPT, 1)


@pytest.mark.parametrize("k", [0, 1, 5])
@pytest.mark.parametrize("as_torch", [False, True])
def test_the_next_tokens_alternatives_are_the_last_rows_top_k(logits, k, as_torch) -> None:
    """Row L - 1 is the first generated token's distribution: its top k, as the CPU engine's
    sampler ranks them (greedy decoding picks the first)."""
    given = torch.from_numpy(logits)[None] if as_torch else logits
    ids, values = reduce_next_token(given, len(PROMPT), k)
    last = torch.log_softmax(torch.from_numpy(logits[len(PROMPT) - 1]), dim=-1)
    best_values, best_ids = torch.topk(last, k)
    assert ids.dtype == np.int32 and ids.shape == values.shape == (k,)
    assert ids.tolist() == best_ids.tolist()
    assert values == pytest.approx(best_values.numpy(), abs=1e-5)
    if k:
        assert ids[0] == int(torch.argmax(torch.from_numpy(logits[len(PROMPT) - 1])))


def test_the_next_token_needs_the_prompts_last_row(logits) -> None:
    with pytest.raises(ValueError, match="5 of the prompt's 8 tokens"):
        reduce_next_token(logits[:5], len(PROMPT), 1)
