"""A prompt's token ids, without paying for a prompt that is too long."""

from __future__ import annotations

from typing import Any

# A prompt longer than max_input_len tokens of this many characters each is refused without
# tokenizing it. Real text averages 3-5 characters per token; even long runs of one character
# merge into tokens of at most a few dozen. A prompt over the bound costs the service nothing,
# where tokenizing it cost ~1 s of CPU per megabyte, and freeing its encoding held the GIL for
# ~100 ms (tokenizers frees one allocation per token).
MAX_CHARS_PER_TOKEN = 64


def encode_prompt(
    tokenizer: Any, prompt: str, add_special_tokens: bool, max_tokens: int
) -> list[int] | int:
    """The prompt's token ids, or only how many there are when that is more than `max_tokens`.

    With a fast tokenizer the ids of a prompt that is too long are never turned into a Python
    list: the Rust encoder runs without the GIL, but building the list of a megabyte prompt's
    ids held it for ~100 ms, stalling the event loop from another thread. transformers'
    `encode` makes the same backend call; a tokenizer configured otherwise (truncation,
    padding, split special tokens) or a slow one goes through `encode` itself.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        backend is None
        or backend.truncation is not None
        or backend.padding is not None
        or backend.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False))
    ):
        ids = list(tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
        return ids if len(ids) <= max_tokens else len(ids)
    (encoding,) = backend.encode_batch([prompt], add_special_tokens=add_special_tokens)
    if len(encoding) > max_tokens:
        return len(encoding)
    return list(encoding.ids)
