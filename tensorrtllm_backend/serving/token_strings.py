"""The text of single tokens, for log probs and their alternatives.

Each token id is decoded once per process (a vocabulary is bounded) and the ids not seen yet are
decoded together in one call: a streamed answer with top log probs names several tokens per
step, and a decode call per id would cost more than the rest of the step on the event loop.
"""

from __future__ import annotations

from typing import Any


class TokenStrings:
    """`strings(ids)`: each id's text as `tokenizer.decode([id])` gives it."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._known: dict[int, str] = {}

    def __call__(self, ids: list[int]) -> list[str]:
        known = self._known
        missing = list(dict.fromkeys(i for i in ids if i not in known))
        if missing:
            texts = self._tokenizer.batch_decode([[i] for i in missing])
            known.update(zip(missing, texts, strict=True))
        return [known[i] for i in ids]
