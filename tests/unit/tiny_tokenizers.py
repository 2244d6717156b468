"""Small tokenizers trained in the test itself, for the unit tests of (de)tokenization."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


def byte_level_bpe(
    corpus: list[str], vocab_size: int, **special_tokens: str
) -> PreTrainedTokenizerFast:
    """A GPT-2 style byte-level BPE trained on `corpus`. Every byte is in its alphabet, so any
    text encodes; its special tokens (`bos_token="<s>"`, ...) come first in the vocabulary, in
    the order given."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special_tokens)
