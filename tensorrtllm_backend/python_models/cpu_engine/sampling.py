"""Next-token selection from logits, following TensorRT-LLM's sampling semantics.

Order: embedding bias, repetition penalty (prompt + generated tokens), presence/frequency
penalties (generated tokens), bans (bad words, end_id before min_tokens), temperature, then greedy
(top_k in {0, 1} with top_p == 0, or temperature == 0) or top-k / top-p sampling with the
request's own torch.Generator (same seed -> same tokens). The returned log prob is the chosen
token's log-softmax after penalties and temperature, before top-k/top-p truncation; a request
with top_logprobs = k also gets the k most likely tokens of that same distribution.
"""

from __future__ import annotations

import torch

from .request import GenRequest, TopLogprobs


def apply_penalties(logits: torch.Tensor, req: GenRequest) -> torch.Tensor:
    """Bias, penalties and bans on a 1-D float32 logits row (modified in place and returned)."""
    if req.embedding_bias is not None:
        bias = torch.as_tensor(req.embedding_bias, dtype=logits.dtype)
        if bias.numel() == logits.numel():
            logits += bias
    sp = req.sampling
    if sp.repetition_penalty != 1.0 and sp.repetition_penalty > 0:
        ids = torch.tensor(sorted(set(req.prompt) | set(req.generated)), dtype=torch.long)
        selected = logits[ids]
        logits[ids] = torch.where(
            selected > 0, selected / sp.repetition_penalty, selected * sp.repetition_penalty
        )
    if (sp.presence_penalty or sp.frequency_penalty) and req.generated:
        ids, counts = torch.unique(
            torch.tensor(req.generated, dtype=torch.long), return_counts=True
        )
        logits[ids] -= sp.presence_penalty + sp.frequency_penalty * counts.to(logits.dtype)
    banned = req.banned_tokens()
    if banned:
        ids = torch.tensor(banned, dtype=torch.long)
        kept = logits[ids].clone()
        logits[ids] = float("-inf")
        if torch.isneginf(logits).all():
            # A guide that allows only banned tokens (its end, before min_tokens): the guide wins,
            # since a token outside it would break the output's format.
            logits[ids] = kept
    return logits


def top_logprobs(logprobs: torch.Tensor, k: int) -> TopLogprobs:
    """The k most likely tokens of a log-softmax row, the most likely first."""
    values, ids = torch.topk(logprobs, min(k, logprobs.numel()))
    return ids.tolist(), values.tolist()


def select_token(
    logits: torch.Tensor, req: GenRequest, generator: torch.Generator
) -> tuple[int, float, TopLogprobs | None]:
    """Pick the next token for one request from its 1-D logits row: (token, its log prob, the
    top-k alternatives when the request asks for them)."""
    logits = apply_penalties(logits.to(torch.float32).clone(), req)
    sp = req.sampling
    if sp.temperature > 0 and sp.temperature != 1.0:
        logits = logits / sp.temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    top = top_logprobs(logprobs, req.top_logprobs) if req.top_logprobs else None
    if sp.greedy:
        # With alternatives, the chosen token is the first of them: argmax and topk may break a
        # tie differently (bf16 logits on a GPU tie often), and greedy must be the top-ranked.
        token = top[0][0] if top else int(torch.argmax(logits))
        return token, float(logprobs[token]), top
    filtered = logits
    if sp.top_k > 1:
        k = min(sp.top_k, filtered.numel())
        kth = torch.topk(filtered, k).values[-1]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if 0.0 < sp.top_p < 1.0:
        sorted_logits, order = torch.sort(filtered, descending=True)
        cumulative = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
        # Drop tokens once the mass before them already reaches top_p (keeps at least one).
        drop = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= sp.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        filtered = torch.full_like(filtered, float("-inf")).scatter(0, order, sorted_logits)
    probs = torch.softmax(filtered, dim=-1)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token]), top
