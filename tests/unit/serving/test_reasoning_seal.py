"""Sealed reasoning: what one deployment seals it opens; a changed blob, one of another key or
not a blob at all does not open."""

from __future__ import annotations

import pytest

from tensorrtllm_backend.serving.responses_api.sealing import ReasoningSeal, new_key


def test_a_seal_opens_with_its_key_only() -> None:
    seal = ReasoningSeal(new_key())
    blob = seal.seal("I think, therefore € ünïcode")
    assert "think" not in blob and seal.open(blob) == "I think, therefore € ünïcode"
    assert seal.seal("same") != seal.seal("same")  # a fresh nonce each time
    changed = blob[:-6] + ("A" if blob[-6] != "A" else "B") + blob[-5:]
    for bad in (changed, ReasoningSeal(new_key()).seal("x"), "not base64!", "", blob[:10]):
        with pytest.raises(ValueError, match="not made by this deployment"):
            seal.open(bad)


def test_a_key_must_be_32_bytes_of_base64() -> None:
    for key in ("short", "", "!" * 44):
        with pytest.raises(ValueError, match="32 bytes"):
            ReasoningSeal(key)
