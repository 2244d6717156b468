"""The tokenizer description NVIDIA's C++ ``tensorrtllm`` backend needs for guided decoding.

That backend never loads a Hugging Face tokenizer: it builds xgrammar's tokenizer info from a JSON
file named by the ``xgrammar_tokenizer_info_path`` parameter of ``tensorrt_llm/config.pbtxt``, with
three keys it reads unconditionally:

* ``encoded_vocab``: every token as stored in the vocabulary (``Ġthe``, ``<0x0A>``, ...), the
  token of id ``i`` at index ``i``;
* ``tokenizer_str``: the serialized ``tokenizers`` backend (``tokenizer.json``), from which xgrammar
  tells a byte-level vocabulary from a byte-fallback or raw one;
* ``stop_token_ids``: the tokens that may end a finished guide.

pack_model.py writes it next to the stored tokenizer, so a packed model needs no extra step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FILE_NAME = "xgrammar_tokenizer_info.json"


class TokenizerInfoError(ValueError):
    """The tokenizer cannot be described for xgrammar; the message says what to fix."""


def tokenizer_info(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """The JSON document the C++ backend reads, for ``tokenizer``.

    Ids missing from the vocabulary (rare gaps) are empty strings, so index and id always agree;
    xgrammar treats an empty token as one it never emits.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerInfoError(
            f"the tokenizer ({type(tokenizer).__name__}) has no tokenizer.json backend, which "
            "xgrammar needs to read its vocabulary type: save a fast tokenizer with "
            "AutoTokenizer.from_pretrained(...).save_pretrained(DIR) and pack DIR"
        )
    vocab = tokenizer.get_vocab()
    encoded: list[str] = [""] * (max(vocab.values()) + 1)
    for token, index in vocab.items():
        encoded[index] = token
    eos = tokenizer.eos_token_id
    if eos is None:
        raise TokenizerInfoError("the tokenizer has no end-of-sequence token to stop a guide on")
    return {"encoded_vocab": encoded, "tokenizer_str": backend.to_str(), "stop_token_ids": [eos]}


def write_tokenizer_info(tokenizer_dir: Path, path: Path) -> Path:
    """Describe the tokenizer stored in ``tokenizer_dir`` into ``path`` and return ``path``."""
    from ..common.tokenization import load_tokenizer

    info = tokenizer_info(load_tokenizer(tokenizer_dir))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, ensure_ascii=False), encoding="utf-8")
    return path
