"""Synthetic backend: deterministic tokens with configurable first-token and inter-token delays.

No torch, no numpy: the per-step cost is a few integer operations per request, so load tests
measure the serving path rather than this engine.

Token formula (documented so tests can predict outputs): with
    h    = prompt_hash(prompt)        = sum((i + 1) * (id + 1) for i, id in enumerate(prompt)) mod 2**31
    span = vocab_size - FIRST_ID      (ids below FIRST_ID = 3 are left to special tokens)
the token at generation step t (0-based) is
    FIRST_ID + (h + 7 * seed + STRIDE * t) mod span
and, if that id is the engine's eos_token_id or banned for this step (bad words, end_id before
min_tokens), the next id upwards (wrapping within [FIRST_ID, vocab_size)) that is allowed.
seed = the engine config's seed + the request's seed. Log probs are 0.0 (log 1: the engine is
certain of each token). Asked for k alternatives, it lists the chosen token at 0.0 and then the
k - 1 ids after it (wrapping within [FIRST_ID, vocab_size)) at -inf: it gives them no chance.
Asked for its prompt's logits (return_context_logits), it gives the position after token x the
logits -((v * 7919 + x * 104729) mod 1000) / 100 for every id v (:func:`context_logits`): a
spread distribution that depends on the token alone, so tests can compute its log probs.
"""

from __future__ import annotations

from collections.abc import Iterable

from .block_cache import BlockTable
from .request import GenRequest, TopLogprobs
from .scheduler import StepResult

FIRST_ID = 3
STRIDE = 37


def prompt_hash(prompt: Iterable[int]) -> int:
    return sum((i + 1) * (int(t) + 1) for i, t in enumerate(prompt)) % (2**31)


def synthetic_token(
    h: int,
    step: int,
    *,
    seed: int,
    vocab_size: int,
    eos_token_id: int,
    banned: Iterable[int] = (),
) -> int:
    """The token at step `step` for a prompt with hash `h` (see the module docstring)."""
    span = vocab_size - FIRST_ID
    offset = (h + 7 * seed + STRIDE * step) % span
    banned_set = set(banned)
    banned_set.add(eos_token_id)
    for _ in range(span):
        token = FIRST_ID + offset
        if token not in banned_set:
            return token
        offset = (offset + 1) % span
    raise ValueError("every token is banned")


def predict_tokens(
    prompt: list[int], n: int, *, vocab_size: int, eos_token_id: int, seed: int = 0
) -> list[int]:
    """The first n tokens the synthetic engine produces for `prompt` when nothing is banned."""
    h = prompt_hash(prompt)
    return [
        synthetic_token(h, t, seed=seed, vocab_size=vocab_size, eos_token_id=eos_token_id)
        for t in range(n)
    ]


def context_logits(prompt: list[int], vocab_size: int) -> object:
    """The synthetic prompt logits [len(prompt), vocab_size] (float32; see the module
    docstring). numpy is imported only here: only requests that ask pay for it."""
    import numpy as np

    ids = np.arange(vocab_size, dtype=np.int64)
    tokens = np.asarray(prompt, dtype=np.int64)[:, None]
    return (-((ids * 7919 + tokens * 104729) % 1000) / 100).astype(np.float32)


class SyntheticBackend:
    """Scheduler backend; delays are applied by the scheduler through ttft_s / itl_s."""

    takes_images = False

    def __init__(
        self,
        *,
        vocab_size: int,
        eos_token_id: int,
        ttft_ms: float = 0.0,
        itl_ms: float = 0.0,
        seed: int = 0,
        reuse: BlockTable | None = None,
    ) -> None:
        """`reuse`: a prefix cache modelled as bookkeeping only (no keys and values, and the
        same first-token delay): which prompts' blocks it holds, reported as cached tokens and
        as KV-cache events, for load tests of prefix-aware routing."""
        if vocab_size <= FIRST_ID + 1:
            raise ValueError(f"vocab_size must be > {FIRST_ID + 1}")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.ttft_s = ttft_ms / 1000.0
        self.itl_s = itl_ms / 1000.0
        self.seed = seed
        self._span = vocab_size - FIRST_ID
        self._reuse = reuse

    def admit(self, req: GenRequest) -> None:
        for token in req.prompt:
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"token id {token} outside the vocabulary [0, {self.vocab_size})")
        req.backend_state = prompt_hash(req.prompt) + 7 * (self.seed + req.sampling.seed)
        if self._reuse is not None:  # at least the last prompt token is computed, as in hf
            found = self._reuse.reusable(req.prompt)
            req.reused_blocks = len(found)
            req.cached_tokens = len(found) * self._reuse.block_size

    def step(self, batch: list[GenRequest]) -> list[StepResult]:
        span = self._span
        eos = self.eos_token_id
        out: list[StepResult] = []
        for req in batch:
            if req.context_logits and not req.generated and req.prompt_logits is None:
                req.prompt_logits = context_logits(req.prompt, self.vocab_size)
            token = FIRST_ID + (req.backend_state + STRIDE * len(req.generated)) % span
            if token == eos or req.bad_words or req.min_tokens:
                banned = req.banned_tokens()
                if token == eos or token in banned:
                    token = synthetic_token(
                        req.backend_state,
                        len(req.generated),
                        seed=0,
                        vocab_size=self.vocab_size,
                        eos_token_id=eos,
                        banned=banned,
                    )
            out.append(
                (token, 0.0, self._top(token, req.top_logprobs) if req.top_logprobs else None)
            )
        return out

    def _top(self, token: int, k: int) -> TopLogprobs:
        """The chosen token for certain, then the next ids upwards with no chance at all."""
        span = self._span
        others = [FIRST_ID + (token - FIRST_ID + j) % span for j in range(1, min(k, span))]
        return [token, *others], [0.0] + [float("-inf")] * len(others)

    def release(self, req: GenRequest) -> None:
        if self._reuse is not None and req.generated:
            # What hf would hold: the prompt and every generated token but the last.
            tokens = req.prompt + req.generated[:-1]
            self._reuse.keep(tokens)
        req.backend_state = None
