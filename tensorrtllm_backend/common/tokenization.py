"""Tokenizer helpers shared by the Triton python models, the BentoML service's direct path and
pack_model.py.

Framework-free on purpose (numpy + transformers only): the same code runs inside the Triton python
stub and inside the service process, so both ways through Triton produce the same text.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    # transformers (and the torch it pulls in) takes ~2 s to import: the service imports it
    # while tritonserver starts, not before (see runtime.LLMRuntime.start).
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = [
    "IncrementalDetokenizer",
    "StopStringMatcher",
    "build_embedding_bias",
    "decode",
    "encode_word_lists",
    "load_checked_tokenizer",
    "load_tokenizer",
    "record_tokenizer_class",
]

# Beside a stored tokenizer: the class AutoTokenizer chose for it at pack time, and under which
# transformers version (see record_tokenizer_class).
TOKENIZER_CLASS_FILE = "trtllm_tokenizer_class.json"

_REPLACEMENT_CHAR = "\ufffd"


def load_tokenizer(tokenizer_dir: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """Load a local tokenizer (never the hub) with pad := eos when it has no pad token.

    NVIDIA's newer preprocessing does the same, so PAD_ID defaults agree with theirs.
    """
    loader = _recorded_class(Path(tokenizer_dir))
    if loader is None:
        from transformers import AutoTokenizer as loader  # type: ignore[assignment]

    tokenizer = loader.from_pretrained(
        os.fspath(tokenizer_dir), local_files_only=True, padding_side="left"
    )
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _recorded_class(tokenizer_dir: Path) -> type[PreTrainedTokenizerFast] | None:
    """transformers' generic fast tokenizer class, when pack time recorded that AutoTokenizer
    chose it for this directory under the transformers version running now; else None.

    The class loads the same tokenizer AutoTokenizer would, without AutoTokenizer's imports:
    on transformers 5 those pull in torch, ~4 s of CPU in every Triton stub that tokenizes and
    in the service, each time tritonserver starts or restarts.
    """
    try:
        record = json.loads((tokenizer_dir / TOKENIZER_CLASS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    import transformers

    return transformers.PreTrainedTokenizerFast if record == _generic_record() else None


def _generic_record() -> dict[str, str]:
    """What the record says of a generic fast tokenizer under the transformers running now."""
    import transformers

    return {"class": "PreTrainedTokenizerFast", "transformers": transformers.__version__}


def record_tokenizer_class(tokenizer_dir: Path) -> None:
    """Pack time: note beside the stored tokenizer whether AutoTokenizer loads it as the generic
    fast tokenizer, which :func:`load_tokenizer` then loads directly (same transformers
    version only: the choice is AutoTokenizer's, and may change between versions)."""
    import transformers

    chosen = type(
        transformers.AutoTokenizer.from_pretrained(os.fspath(tokenizer_dir), local_files_only=True)
    )
    path = tokenizer_dir / TOKENIZER_CLASS_FILE
    if chosen is transformers.PreTrainedTokenizerFast:
        path.write_text(json.dumps(_generic_record()) + "\n", encoding="utf-8")
    else:
        path.unlink(missing_ok=True)


def load_checked_tokenizer(
    tokenizer_dir: Path,
    markers: Sequence[str],
    hint: str,
    error: type[ValueError],
) -> PreTrainedTokenizerBase:
    """Pack time: the tokenizer the service and the models will load, with an end token.

    Raises `error` naming what is missing; `hint` (when no tokenizer file is there) says which
    option points at the right directory.
    """
    if not tokenizer_dir.is_dir():
        raise error(f"tokenizer directory {tokenizer_dir} does not exist")
    if not any((tokenizer_dir / name).is_file() for name in markers):
        raise error(
            f"no tokenizer in {tokenizer_dir} (expected one of {', '.join(markers)}): {hint}"
        )
    try:
        tokenizer = load_tokenizer(tokenizer_dir)
    except Exception as exc:  # transformers raises many kinds
        raise error(f"cannot load the tokenizer in {tokenizer_dir}: {exc}") from exc
    if tokenizer.eos_token_id is None:
        raise error(f"the tokenizer in {tokenizer_dir} has no end-of-sequence token")
    return tokenizer


def decode(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], skip_special_tokens: bool = True
) -> str:
    """Decode with the settings every path uses, so streamed and whole-text decoding agree."""
    return tokenizer.decode(
        list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
    )


def bound_decoder(
    tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool = True
) -> Callable[[list[int]], str]:
    """`decode` for one tokenizer, for per-token use.

    For a fast tokenizer whose class keeps transformers' own decode, that decode (without the
    clean-up) is exactly the Rust backend's, which costs a quarter as much per call: the
    backend is called directly. Any other tokenizer goes through `decode`.
    """
    from transformers import PreTrainedTokenizerFast

    cls = type(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        backend is not None
        and issubclass(cls, PreTrainedTokenizerFast)
        and cls.decode is PreTrainedTokenizerFast.decode
        and cls._decode is PreTrainedTokenizerFast._decode
    ):
        backend_decode = backend.decode

        def fast(ids: list[int]) -> str:
            return str(backend_decode(ids, skip_special_tokens=skip_special_tokens))

        return fast

    def general(ids: list[int]) -> str:
        return decode(tokenizer, ids, skip_special_tokens)

    return general


def _as_str(value: object) -> str:
    """Triton STRING tensors arrive as bytes (or numpy objects); words are UTF-8 text."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8")
    return str(value)


def encode_word_lists(
    tokenizer: PreTrainedTokenizerBase, batch: Sequence[Iterable[object]]
) -> np.ndarray:
    """Encode per-row stop/bad words into TensorRT-LLM's `[batch, 2, L]` INT32 layout.

    Row 0 holds the token ids of all words of a batch row concatenated, row 1 the cumulative end
    offset of each word. Edge cases, as in NVIDIA's contract:
    - each word is encoded with add_special_tokens=False; empty words and words that encode to no
      token are skipped (they could never match);
    - ids are padded with 0 and offsets with -1 up to L = max(1, longest id list in the batch);
    - when no row has any word the result is `[batch, 2, 0]` (the engine then sees "no words").
    Example: "a b" -> [5, 6] and "c" -> [7] give [[[5, 6, 7], [2, 3, -1]]].
    """
    rows_ids: list[list[int]] = []
    rows_offsets: list[list[int]] = []
    for words in batch:
        ids: list[int] = []
        offsets: list[int] = []
        for word in words:
            text = _as_str(word)
            if not text:
                continue
            word_ids = tokenizer.encode(text, add_special_tokens=False)
            if not word_ids:
                continue
            ids.extend(int(i) for i in word_ids)
            offsets.append(len(ids))
        rows_ids.append(ids)
        rows_offsets.append(offsets)

    if not any(rows_ids):
        return np.zeros((len(rows_ids), 2, 0), dtype=np.int32)
    width = max(1, max(len(ids) for ids in rows_ids))
    out = np.zeros((len(rows_ids), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for row, (ids, offsets) in enumerate(zip(rows_ids, rows_offsets, strict=True)):
        out[row, 0, : len(ids)] = ids
        out[row, 1, : len(offsets)] = offsets
    return out


def build_embedding_bias(
    tokenizer: PreTrainedTokenizerBase,
    words: Sequence[object],
    weights: Sequence[float],
    vocab_size: int,
) -> np.ndarray:
    """Vocab-sized FP32 bias for one request: every token of a word gets that word's weight.

    Tokens shared by several words get the sum, which keeps the operation order-independent.
    Token ids outside the engine's vocabulary are ignored rather than failing the request.
    """
    if len(words) != len(weights):
        raise ValueError(
            f"embedding_bias_words has {len(words)} entries but embedding_bias_weights has "
            f"{len(weights)}"
        )
    bias = np.zeros(vocab_size, dtype=np.float32)
    for word, weight in zip(words, weights, strict=True):
        text = _as_str(word)
        if not text:
            continue
        for token_id in tokenizer.encode(text, add_special_tokens=False):
            if 0 <= token_id < vocab_size:
                bias[token_id] += float(weight)
    return bias


class IncrementalDetokenizer:
    """Turn a stream of token ids into text deltas that are final.

    Decoding each chunk on its own loses multi-byte characters split across byte-level BPE tokens
    and the leading spaces of SentencePiece pieces. Instead, a small window of already emitted
    tokens (the prefix) is decoded together with the new ones and only the text after the prefix
    is emitted (the prefix/read-offset technique). A trailing run of U+FFFD is an incomplete
    character: it is held back until its remaining bytes arrive. Emitted tokens before the window
    are dropped, so each step decodes only a few tokens.

    Invariants (tested): the concatenated feed() results equal decode(all ids) without a trailing
    run of U+FFFD, and adding flush() gives exactly decode(all ids). The Triton models do not emit
    the flushed remainder (a partial character at the very end is not text; the ensemble's
    postprocessing cannot see the end of a stream, so all paths drop it the same way).

    Limitation: tokenizers with a ByteFallback decoder (Llama/SentencePiece) turn a whole run of
    byte tokens into U+FFFD when any byte of it is invalid; for such garbage runs the streamed
    U+FFFD placement can differ from a whole decode. Valid UTF-8 is always exact.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool = True):
        self._decode = bound_decoder(tokenizer, skip_special_tokens)
        self._ids: list[int] = []  # window: tokens from the prefix start onwards
        self._read_offset = 0  # within _ids: first token whose text is not fully emitted
        self._emitted = 0  # characters of the text after the prefix already emitted
        # Skipped specials are dropped up front: in the window they would decode to nothing and
        # leave a prefix without text, whose absence strips the next piece's leading space.
        self._dropped: frozenset[int] = (
            frozenset(tokenizer.all_special_ids) if skip_special_tokens else frozenset()
        )

    def _pending_text(self) -> str:
        """Text of the tokens after the prefix, decoded in the context of the prefix."""
        prefix_text = self._decode(self._ids[: self._read_offset]) if self._read_offset else ""
        full_text = self._decode(self._ids)
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""

    def feed(self, token_ids: Iterable[int]) -> str:
        """Add newly generated ids; return the text that became final (possibly "")."""
        new_ids = [int(i) for i in token_ids if int(i) not in self._dropped]
        if not new_ids:
            return ""
        self._ids.extend(new_ids)
        text = self._pending_text()
        stable = text.rstrip(_REPLACEMENT_CHAR)
        delta = stable[self._emitted :]
        if len(stable) < len(text) or not text:
            # Incomplete character at the end (or no visible text yet): keep the window and
            # remember how much of its text is out already.
            self._emitted = max(self._emitted, len(stable))
            return delta
        # Everything read is final: those tokens become the next prefix (context for spaces).
        self._ids = self._ids[self._read_offset :]
        self._read_offset = len(self._ids)
        self._emitted = 0
        return delta

    def flush(self) -> str:
        """Release held-back text at the end of the stream (an incomplete tail as U+FFFD)."""
        text = self._pending_text()[self._emitted :]
        self._ids = []
        self._read_offset = 0
        self._emitted = 0
        return text


class StopStringMatcher:
    """Text-level stop strings for streamed output.

    Token-level stop words miss strings that tokenize differently in context, so the text is
    checked too. Feed text deltas; the matcher returns the part that is safe to emit and holds back
    a suffix that could still grow into a stop string. At the first stop string the text is cut
    (the stop string itself is not returned) and everything after it is suppressed.
    """

    def __init__(self, stop_strings: Iterable[str]):
        self._stops = sorted({s for s in stop_strings if s}, key=len)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that cut the text

    @property
    def active(self) -> bool:
        """False when there is nothing to match (callers may skip feed())."""
        return bool(self._stops)

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, stopped)."""
        if self.stopped:
            return "", True
        buffer = self._held + text
        if not self._stops:
            self._held = ""
            return buffer, False
        cut = -1
        for stop in self._stops:
            index = buffer.find(stop)
            if index != -1 and (cut == -1 or index < cut):
                cut = index
                self.matched = stop
        if cut != -1:
            self._held = ""
            self.stopped = True
            return buffer[:cut], True
        hold = self._partial_match_length(buffer)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return buffer[: len(buffer) - hold], False

    def _partial_match_length(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def flush(self) -> str:
        """Release the held-back suffix at the end of the stream (it did not become a stop)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
