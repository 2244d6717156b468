"""Multimodal rotary positions (M-RoPE, the Qwen2-VL family's) in the hf engine's packed step.

Qwen2-VL rotates each token's query and key by three positions, temporal, height and width: a
text token has the same one in all three, an image token its place in its image's grid, and the
text after an image goes on from the grid's largest position + 1, not from the token count. So a
prompt's positions come from the model's own `get_rope_index`, and so does its rope delta (its
last position + 1 - its length): a token generated at cache column c is at c + delta in all
three, as transformers' generate() and TensorRT-LLM (its mrope_position_deltas) place it.

Only the rotation changes: the slot cache keeps every token at its column (its index in its
sequence), and the step passes the rotary positions as [3, 1, tokens] position ids, which the
model's rotary embedding takes as they are (a [1, tokens] row it repeats in all three). A step
with no image request in it passes the columns, as for any other model.
"""

from __future__ import annotations

from typing import Any

import torch

from .request import GenRequest


class MRope:
    """A model's M-RoPE: its prompts' positions and rope deltas."""

    def __init__(self, rope_index: Any, image_token_id: int) -> None:
        self._rope_index = rope_index
        self.image_token_id = image_token_id

    @classmethod
    def of(cls, model: Any, image_token_id: int) -> MRope | None:
        """The model's M-RoPE, None for a model with 1-D positions (its base model has no
        get_rope_index)."""
        rope_index = getattr(getattr(model, "model", None), "get_rope_index", None)
        return cls(rope_index, image_token_id) if callable(rope_index) else None

    @torch.inference_mode()
    def prompt(self, prompt: list[int], image_grid_thw: torch.Tensor) -> tuple[torch.Tensor, int]:
        """A prompt's positions [3, tokens] (on the CPU) and its rope delta: image tokens
        (mm_token_type_ids 1, as the processor marks them) laid out by `image_grid_thw`, each
        image's [temporal, height, width] patches."""
        ids = torch.tensor([prompt], dtype=torch.long)
        positions, delta = self._rope_index(
            ids,
            mm_token_type_ids=(ids == self.image_token_id).long(),
            image_grid_thw=image_grid_thw.cpu(),
        )
        return positions[:, 0].cpu(), int(delta.reshape(-1)[0])


def step_positions(
    columns: torch.Tensor, decoding: list[GenRequest], joining: list[GenRequest]
) -> torch.Tensor:
    """The step's rotary positions: [3, 1, tokens] where a request in it has M-RoPE positions
    (a joining prompt's, from its reused prefix on) or a rope delta (a decoding request's
    `length + delta`); otherwise the columns [1, tokens] (packed as in _StepLayout.pack)."""
    decoders: list[Any] = [req.backend_state for req in decoding]  # hf.py's _SeqState
    joiners: list[Any] = [req.backend_state for req in joining]
    if not any(state.rope_delta for state in decoders) and all(
        state.rope is None for state in joiners
    ):
        return columns[None]
    parts = []
    if decoders:
        ends = [state.length + state.rope_delta for state in decoders]
        parts.append(torch.tensor(ends, dtype=torch.long).expand(3, -1))
    for req, state in zip(joining, joiners, strict=True):
        if state.rope is not None:  # its prompt from the end of its reused prefix
            parts.append(state.rope[:, state.length :])
        else:
            parts.append(torch.arange(state.length, len(req.prompt)).expand(3, -1))
    return torch.cat(parts, dim=1).to(columns.device)[:, None]
