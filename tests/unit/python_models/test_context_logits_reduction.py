"""Prompt log probs reduced from context logits: numpy (host) and torch (device) agree with
log_softmax, block by block, for any k; a short logits matrix is an error."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tensorrtllm_backend.python_models import prompt_scores  # noqa: E402
from tensorrtllm_backend.python_models.prompt_scores import reduce_logits  # noqa: E402

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
