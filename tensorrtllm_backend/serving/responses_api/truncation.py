"""`truncation: "auto"`: a conversation longer than the model takes loses its oldest turns.

A turn starts at a user message; what comes before the kept turns is left out, but for the system
and developer messages (they stay, first). The fewest turns are dropped: the search renders the
prompt O(log turns) times. A conversation whose last turn alone is too long is kept whole: the
engine's check then answers the 400 that says so. Blocking (it renders the prompt).
"""

from __future__ import annotations

from collections.abc import Callable

from ..chat.core import ChatCore
from ..chat.request import ChatRequest
from .protocol import InputItem, MessageItem


def fitting_items(
    items: list[InputItem], chat: Callable[[list[InputItem]], ChatRequest], core: ChatCore
) -> list[InputItem]:
    """`items`, their oldest turns left out until the prompt fits max_input_len (`chat`: the
    chat request of some items)."""
    limit = core.generator.limits.max_input_len

    def fits(kept: list[InputItem]) -> bool:
        return core.prompt_tokens(chat(kept)) <= limit

    if fits(items):
        return items
    starts = [
        i for i, item in enumerate(items) if isinstance(item, MessageItem) and item.role == "user"
    ]

    def from_turn(turn: int) -> list[InputItem]:
        start = starts[turn]
        system = [
            item
            for item in items[:start]
            if isinstance(item, MessageItem) and item.role in ("system", "developer")
        ]
        return system + items[start:]

    low, high = 1, len(starts) - 1  # the first turn that may be kept; the last one always is
    if high < low:
        return items
    if not fits(from_turn(high)):
        return from_turn(high)
    while low < high:  # the earliest turn from which the rest fits
        middle = (low + high) // 2
        if fits(from_turn(middle)):
            high = middle
        else:
            low = middle + 1
    return from_turn(low)
