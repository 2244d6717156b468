"""Unit tests of tensorrtllm_backend.common.tokenization with tokenizers trained locally (no hub)."""

from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tiny_tokenizers import byte_level_bpe
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tensorrtllm_backend.common.tokenization import (
    IncrementalDetokenizer,
    StopStringMatcher,
    bound_decoder,
    build_embedding_bias,
    decode,
    encode_word_lists,
    load_tokenizer,
)

CORPUS = [
    "Hello world, this is a tiny corpus for a tiny tokenizer.",
    "Grüße aus München! Ça va? naïve café déjà vu",
    "日本語のテキストと中文文本 also emoji 🙂🚀✨ and 한국어",
    "The quick brown fox jumps over the lazy dog 0123456789",
] * 20
SPECIALS = ["<unk>", "<s>", "</s>"]


def _byte_level_bpe() -> PreTrainedTokenizerFast:
    return byte_level_bpe(CORPUS, 400, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _sentencepiece_style() -> PreTrainedTokenizerFast:
    """Llama-like: Metaspace pieces ("▁word") with byte fallback for unseen characters."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS + byte_tokens)
    tok.train_from_iterator(CORPUS[:3] * 5, trainer)  # CJK / emoji partly left to byte fallback
    # The byte tokens were registered as special only to reserve ids: make them ordinary pieces.
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in SPECIALS]
    tok = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


@pytest.fixture(scope="module")
def bpe() -> PreTrainedTokenizerFast:
    return _byte_level_bpe()


@pytest.fixture(scope="module")
def spm() -> PreTrainedTokenizerFast:
    return _sentencepiece_style()


def test_load_tokenizer_sets_pad_to_eos(bpe: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    bpe.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert loaded.pad_token == "</s>"
    assert loaded.pad_token_id == loaded.eos_token_id


def test_word_list_layout_matches_contract_example(bpe: PreTrainedTokenizerFast) -> None:
    a_b = bpe.encode("Hello world", add_special_tokens=False)
    c = bpe.encode("fox", add_special_tokens=False)
    out = encode_word_lists(bpe, [["Hello world", "fox"]])
    assert out.dtype == np.int32
    assert out.shape == (1, 2, len(a_b) + len(c))
    assert out[0, 0].tolist() == a_b + c
    assert out[0, 1].tolist() == [len(a_b), len(a_b) + len(c)] + [-1] * (len(a_b) + len(c) - 2)


def test_word_list_pads_rows_and_accepts_bytes(bpe: PreTrainedTokenizerFast) -> None:
    long_ids = bpe.encode("The quick brown fox", add_special_tokens=False)
    out = encode_word_lists(bpe, [[b"The quick brown fox"], [b"dog"]])
    dog = bpe.encode("dog", add_special_tokens=False)
    assert out.shape == (2, 2, len(long_ids))
    assert out[1, 0].tolist() == dog + [0] * (len(long_ids) - len(dog))
    assert out[1, 1].tolist() == [len(dog)] + [-1] * (len(long_ids) - 1)


def test_word_list_empty_and_unencodable(bpe: PreTrainedTokenizerFast) -> None:
    assert encode_word_lists(bpe, [[], []]).shape == (2, 2, 0)
    assert encode_word_lists(bpe, [[""], [b""]]).shape == (2, 2, 0)
    # A row without words next to a row with words: offsets all -1, ids all 0.
    out = encode_word_lists(bpe, [[], ["", "dog"]])
    dog = bpe.encode("dog", add_special_tokens=False)
    assert out.shape == (2, 2, len(dog))
    assert out[0].tolist() == [[0] * len(dog), [-1] * len(dog)]
    assert out[1, 1, 0] == len(dog)


def test_embedding_bias(bpe: PreTrainedTokenizerFast) -> None:
    bias = build_embedding_bias(bpe, [b"fox", "dog"], [1.5, -2.0], vocab_size=len(bpe))
    assert bias.shape == (len(bpe),) and bias.dtype == np.float32
    for token_id in bpe.encode("fox", add_special_tokens=False):
        assert bias[token_id] == pytest.approx(1.5)
    assert bias.sum() == pytest.approx(
        1.5 * len(bpe.encode("fox", add_special_tokens=False))
        - 2.0 * len(bpe.encode("dog", add_special_tokens=False))
    )
    with pytest.raises(ValueError, match="entries"):
        build_embedding_bias(bpe, ["fox"], [], vocab_size=len(bpe))


def _stream(
    tok: PreTrainedTokenizerFast, ids: list[int], rng: random.Random, skip: bool = True
) -> list[str]:
    """Feed ids in random chunks; check the no-flush invariant; return the pieces incl. flush."""
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    pieces: list[str] = []
    pos = 0
    while pos < len(ids):
        step = rng.choice([1, 1, 1, 2, 3])
        pieces.append(detok.feed(ids[pos : pos + step]))
        pos += step
    whole = decode(tok, ids, skip)
    assert "".join(pieces) == whole.rstrip("\ufffd")
    pieces.append(detok.flush())
    return pieces


@pytest.mark.parametrize("kind", ["bpe", "spm"])
def test_incremental_detokenizer_equals_full_decode_on_text(
    kind: str, request: pytest.FixtureRequest
) -> None:
    tok = request.getfixturevalue(kind)
    rng = random.Random(1)
    for text in CORPUS[:4] + [" leading space", "a  b   c", "🙂🙂 x 日本"]:
        ids = tok.encode(text, add_special_tokens=False)
        pieces = _stream(tok, ids, rng)
        assert "".join(pieces) == decode(tok, ids)
        assert all("\ufffd" not in piece for piece in pieces)


@pytest.mark.parametrize("skip", [True, False])
def test_incremental_detokenizer_random_byte_level_streams(
    bpe: PreTrainedTokenizerFast, skip: bool
) -> None:
    """Random ids (lone bytes of multi-byte chars, invalid UTF-8, specials) == full decode.

    This is what a random-weight demo model with a byte-level BPE tokenizer produces.
    """
    rng = random.Random(7)
    for _ in range(80):
        ids = [rng.randrange(len(bpe)) for _ in range(rng.randrange(1, 40))]
        pieces = _stream(bpe, ids, rng, skip)
        assert "".join(pieces) == decode(bpe, ids, skip_special_tokens=skip)


@pytest.mark.parametrize("skip", [True, False])
def test_incremental_detokenizer_random_sentencepiece_streams(
    spm: PreTrainedTokenizerFast, skip: bool
) -> None:
    """Random mixes of pieces, specials and byte-fallback characters == full decode.

    Byte-fallback runs are valid UTF-8 here: the ByteFallback decoder turns a whole run into
    U+FFFD when any byte of it is invalid, which no incremental decoder can reproduce before the
    run ends (documented limitation; only random garbage output is affected).
    """
    rng = random.Random(11)
    pieces_pool = [i for tok, i in spm.get_vocab().items() if not tok.startswith("<0x")]
    chars = list("日本語🙂🚀✨한국어éü ")
    for _ in range(80):
        ids: list[int] = []
        for _ in range(rng.randrange(1, 25)):
            if rng.random() < 0.3:
                ids += spm.encode(rng.choice(chars), add_special_tokens=False)
            else:
                ids.append(rng.choice(pieces_pool))
        pieces = _stream(spm, ids, rng, skip)
        assert "".join(pieces) == decode(spm, ids, skip_special_tokens=skip)


def test_incremental_detokenizer_holds_back_partial_characters(
    bpe: PreTrainedTokenizerFast,
) -> None:
    # Byte-level tokens of "é" (2 bytes) fed one byte at a time.
    byte_ids = [bpe.convert_tokens_to_ids(ch) for ch in "Ã©"]  # byte-level alphabet for c3 a9
    detok = IncrementalDetokenizer(bpe)
    assert detok.feed([byte_ids[0]]) == ""
    assert detok.feed([byte_ids[1]]) == "é"
    assert detok.flush() == ""
    # Text before an incomplete character is released at once; the partial one only by flush.
    detok = IncrementalDetokenizer(bpe)
    assert detok.feed(bpe.encode("ab", add_special_tokens=False) + [byte_ids[0]]) == "ab"
    assert detok.flush() == "\ufffd"


def test_incremental_detokenizer_keeps_sentencepiece_spaces(spm: PreTrainedTokenizerFast) -> None:
    ids = spm.encode("The quick brown fox", add_special_tokens=False)
    detok = IncrementalDetokenizer(spm)
    text = "".join(detok.feed([i]) for i in ids) + detok.flush()
    assert text == "The quick brown fox"


def test_incremental_detokenizer_skips_special_tokens(bpe: PreTrainedTokenizerFast) -> None:
    ids = bpe.encode("Hello", add_special_tokens=False) + [bpe.eos_token_id]
    detok = IncrementalDetokenizer(bpe, skip_special_tokens=True)
    assert "".join(detok.feed([i]) for i in ids) + detok.flush() == "Hello"
    detok = IncrementalDetokenizer(bpe, skip_special_tokens=False)
    assert "".join(detok.feed([i]) for i in ids) + detok.flush() == "Hello</s>"


@pytest.mark.parametrize("kind", ["bpe", "spm"])
@pytest.mark.parametrize("skip", [True, False])
def test_bound_decoder_equals_decode(request: pytest.FixtureRequest, kind: str, skip: bool) -> None:
    tok = request.getfixturevalue(kind)
    rng = random.Random(7)
    streams = [[rng.randrange(len(tok)) for _ in range(rng.randrange(0, 12))] for _ in range(300)]
    fast = bound_decoder(tok, skip)
    assert all(fast(ids) == decode(tok, ids, skip) for ids in streams)


def test_bound_decoder_respects_a_tokenizer_with_its_own_decode(
    bpe: PreTrainedTokenizerFast,
) -> None:
    class Shouting(type(bpe)):  # type: ignore[misc]
        def decode(self, token_ids: object, **kwargs: object) -> str:  # type: ignore[override]
            return str(super().decode(token_ids, **kwargs)).upper()

    shouting = copy.copy(bpe)
    shouting.__class__ = Shouting
    ids = bpe.encode("Hello world", add_special_tokens=False)
    assert bound_decoder(shouting)(ids) == "HELLO WORLD"
    detok = IncrementalDetokenizer(shouting)
    assert "".join(detok.feed([i]) for i in ids) + detok.flush() == "HELLO WORLD"


def _run_matcher(stops: list[str], chunks: list[str]) -> tuple[str, bool, int]:
    matcher = StopStringMatcher(stops)
    out = []
    stopped_at = -1
    for index, chunk in enumerate(chunks):
        text, stopped = matcher.feed(chunk)
        out.append(text)
        if stopped and stopped_at == -1:
            stopped_at = index
    out.append(matcher.flush())
    return "".join(out), stopped_at != -1, stopped_at


def test_stop_matcher_across_chunk_borders() -> None:
    assert _run_matcher(["STOP"], ["abc S", "T", "OP def"]) == ("abc ", True, 2)
    assert _run_matcher(["\n\n"], ["line\n", "\nnext"]) == ("line", True, 1)


def test_stop_matcher_holds_back_only_possible_prefixes() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("abc ST") == ("abc ", False)
    assert matcher.feed("ore") == ("STore", False)  # the held "ST" was not a stop after all
    assert matcher.flush() == ""
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("ends with S") == ("ends with ", False)
    assert matcher.flush() == "S"


def test_stop_matcher_first_stop_wins_and_suppresses_rest() -> None:
    assert _run_matcher(["world", "lo w"], ["hel", "lo world", " more"])[0] == "hel"
    matcher = StopStringMatcher(["x"])
    assert matcher.feed("axb") == ("a", True)
    assert matcher.feed("more") == ("", True)
    assert matcher.flush() == ""


def test_stop_matcher_without_stops_passes_through() -> None:
    assert _run_matcher([], ["a", "b"]) == ("ab", False, -1)
    assert _run_matcher([""], ["a", "b"]) == ("ab", False, -1)


def test_stop_matcher_random_chunking_matches_whole_text() -> None:
    rng = random.Random(3)
    text = "one two three four five six seven eight nine ten" * 2
    for stop in ["four", "e n", "ten", "zzz", "n"]:
        expected = text[: text.find(stop)] if stop in text else text
        for _ in range(30):
            cuts = sorted(rng.sample(range(1, len(text)), 6))
            chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
            assert _run_matcher([stop], chunks)[0] == expected


# --- the class recorded at pack time --------------------------------------------------------------


def _load_in_fresh_process(tokenizer_dir: Path) -> dict[str, object]:
    """load_tokenizer in a new interpreter: its class, whether torch got imported, a round trip."""
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from tensorrtllm_backend.common.tokenization import load_tokenizer\n"
        f"t = load_tokenizer({str(tokenizer_dir)!r})\n"
        "ids = t.encode('Grüße, 🙂 world')\n"
        "print(json.dumps({'class': type(t).__name__, 'torch': 'torch' in sys.modules,"
        " 'ids': ids, 'text': t.decode(ids), 'pad': t.pad_token,"
        " 'template': t.chat_template}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_recorded_generic_tokenizer_loads_as_autotokenizer_would_without_torch(
    demo_checkpoint: Path, tmp_path: Path
) -> None:
    import shutil

    import transformers

    from tensorrtllm_backend.common.tokenization import TOKENIZER_CLASS_FILE, record_tokenizer_class

    stored = tmp_path / "tokenizer"
    shutil.copytree(demo_checkpoint, stored)
    unrecorded = _load_in_fresh_process(stored)
    record_tokenizer_class(stored)
    record = json.loads((stored / TOKENIZER_CLASS_FILE).read_text())
    assert record == {"class": "PreTrainedTokenizerFast", "transformers": transformers.__version__}
    recorded = _load_in_fresh_process(stored)
    assert unrecorded["torch"] and not recorded["torch"]  # AutoTokenizer imports torch
    assert {k: v for k, v in recorded.items() if k != "torch"} == {
        k: v for k, v in unrecorded.items() if k != "torch"
    }

    # Recorded under another transformers version: AutoTokenizer decides again.
    (stored / TOKENIZER_CLASS_FILE).write_text(json.dumps({**record, "transformers": "0.0.1"}))
    assert _load_in_fresh_process(stored)["torch"]


def test_no_record_for_a_model_specific_tokenizer_class(tmp_path: Path) -> None:
    """AutoTokenizer picks GPT2's own class here: nothing is recorded, so it keeps choosing."""
    from tensorrtllm_backend.common.tokenization import TOKENIZER_CLASS_FILE, record_tokenizer_class

    _byte_level_bpe().save_pretrained(tmp_path)
    config = tmp_path / "tokenizer_config.json"
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "tokenizer_class": "GPT2Tokenizer"})
    )
    (tmp_path / TOKENIZER_CLASS_FILE).write_text("{}")  # a stale record goes
    record_tokenizer_class(tmp_path)
    assert not (tmp_path / TOKENIZER_CLASS_FILE).exists()
    assert type(load_tokenizer(tmp_path)).__name__.startswith("GPT2")
