"""Prompt log probs from context logits, reduced next to the engine.

An engine's context logits are a [prompt tokens, vocabulary] matrix: hundreds of megabytes for a
long prompt and a large vocabulary. What a client asks for (each prompt token's log prob, and
the k most likely tokens at each position, with their log probs, and its rank) is
(tokens - 1) x (2k + 2) numbers, so the reduction runs here, in a Triton Python model beside the
engine, and only its result crosses gRPC. Row t of the logits is the distribution of token t + 1:
the first prompt token has no log prob, and the last row is the distribution of the first
generated token (:func:`reduce_next_token`: its k most likely, where the generation returns no
alternatives of its own).

Logits on a GPU (the C++ backend's, through DLPack) are reduced there with torch; logits on the
host with numpy, a block of rows at a time so that the float32 temporaries stay bounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

ROWS_PER_BLOCK = 256  # rows of float32 temporaries at a time on the host
OUTPUTS = ("prompt_log_probs", "prompt_top_token_ids", "prompt_top_log_probs", "prompt_token_ranks")
NEXT_OUTPUTS = ("next_top_token_ids", "next_top_log_probs")  # of reduce_next_token


class PromptScores(NamedTuple):
    """Prompt tokens 1..L-1: each one's log prob [L-1], the k most likely tokens at its
    position with their log probs [L-1, k] (the most likely first), and each token's rank in
    its position's distribution [L-1] (1: the most likely; ties rank alike)."""

    log_probs: np.ndarray
    top_ids: np.ndarray
    top_log_probs: np.ndarray
    ranks: np.ndarray


def reduce_logits(logits: Any, prompt: Sequence[int], k: int) -> PromptScores:
    """`logits`: [L, V] (or [1, L, V]) as numpy or torch; `prompt`: the L token ids."""
    if getattr(logits, "ndim", 0) == 3:
        logits = logits[0]
    rows = len(prompt) - 1
    if logits.shape[0] < len(prompt):
        raise ValueError(
            f"the engine returned context logits for {logits.shape[0]} of the prompt's "
            f"{len(prompt)} tokens"
        )
    if rows <= 0:
        empty = np.zeros((0, k), dtype=np.float32)
        none = np.zeros(0, dtype=np.float32)
        return PromptScores(none, empty.astype(np.int32), empty, none.astype(np.int32))
    if not isinstance(logits, np.ndarray):
        return _reduce_torch(logits, prompt, k)
    following = np.asarray(prompt[1:], dtype=np.int64)
    log_probs = np.empty(rows, dtype=np.float32)
    top_ids = np.empty((rows, k), dtype=np.int32)
    top_values = np.empty((rows, k), dtype=np.float32)
    ranks = np.empty(rows, dtype=np.int32)
    for start in range(0, rows, ROWS_PER_BLOCK):
        stop = min(rows, start + ROWS_PER_BLOCK)
        block = logits[start:stop].astype(np.float32)
        normaliser = _normaliser(block)
        chosen = block[np.arange(stop - start), following[start:stop]]
        log_probs[start:stop] = chosen - normaliser[:, 0]
        ranks[start:stop] = 1 + (block > chosen[:, None]).sum(axis=1)
        if k:
            top_ids[start:stop], top_values[start:stop] = _top(block, normaliser, k)
    return PromptScores(log_probs, top_ids, top_values, ranks)


def reduce_next_token(logits: Any, length: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely tokens after a prompt of `length` tokens and their log probs, [k] each
    (the most likely first): the logits' row `length` - 1, the distribution the engine draws the
    first generated token from before any sampling parameter changes it (greedy decoding picks
    its most likely)."""
    if getattr(logits, "ndim", 0) == 3:
        logits = logits[0]
    if not 0 < length <= logits.shape[0]:
        raise ValueError(
            f"the engine returned context logits for {logits.shape[0]} of the prompt's "
            f"{length} tokens"
        )
    row = logits[length - 1 : length]
    if not k:
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
    if not isinstance(row, np.ndarray):
        import torch

        values, ids = torch.topk(torch.log_softmax(row.float(), dim=-1), k, dim=-1)
        return ids[0].to(torch.int32).cpu().numpy(), values[0].cpu().numpy()
    block = row.astype(np.float32)
    ids, values = _top(block, _normaliser(block), k)
    return ids[0].astype(np.int32), values[0]


def _normaliser(block: np.ndarray) -> np.ndarray:
    """Each row's log-sum-exp, [rows, 1]: a logit minus it is the token's log prob."""
    peak = block.max(axis=1, keepdims=True)
    return peak + np.log(np.exp(block - peak).sum(axis=1, keepdims=True))


def _top(block: np.ndarray, normaliser: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely tokens of each row and their log probs, the most likely first."""
    ids = np.argpartition(-block, k - 1, axis=1)[:, :k]
    values = np.take_along_axis(block, ids, axis=1) - normaliser
    order = np.argsort(-values, axis=1, kind="stable")
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(values, order, axis=1)


def _reduce_torch(logits: Any, prompt: Sequence[int], k: int) -> PromptScores:
    """The same reduction on the logits' own device: only the result is copied to the host."""
    import torch

    rows = len(prompt) - 1
    following = torch.as_tensor(prompt[1:], dtype=torch.long, device=logits.device)
    log_probs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    top_ids = torch.empty((rows, k), dtype=torch.long, device=logits.device)
    top_values = torch.empty((rows, k), dtype=torch.float32, device=logits.device)
    ranks = torch.empty(rows, dtype=torch.int32, device=logits.device)
    for start in range(0, rows, ROWS_PER_BLOCK):
        stop = min(rows, start + ROWS_PER_BLOCK)
        block = torch.log_softmax(logits[start:stop].float(), dim=-1)
        chosen = block.gather(1, following[start:stop, None])
        log_probs[start:stop] = chosen[:, 0]
        ranks[start:stop] = 1 + (block > chosen).sum(dim=1)
        if k:
            values, ids = torch.topk(block, k, dim=-1)
            top_ids[start:stop], top_values[start:stop] = ids, values
    return PromptScores(
        log_probs.cpu().numpy(),
        top_ids.to(torch.int32).cpu().numpy(),
        top_values.cpu().numpy(),
        ranks.cpu().numpy(),
    )
