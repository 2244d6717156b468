"""The xgrammar tokenizer file for NVIDIA's C++ backend: written from the demo tokenizer, read back
the way that backend reads it (xgrammar's tokenizer info from the vocabulary and the backend
string), and used to compile and enforce a JSON schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xgrammar as xgr
from transformers import ByT5Tokenizer, PreTrainedTokenizerBase

from tensorrtllm_backend.common.tokenization import load_tokenizer
from tensorrtllm_backend.packing.xgrammar_info import (
    FILE_NAME,
    TokenizerInfoError,
    tokenizer_info,
    write_tokenizer_info,
)

SCHEMA = {
    "type": "object",
    "properties": {"sky": {"enum": ["clear", "rain"]}, "windy": {"type": "boolean"}},
    "required": ["sky", "windy"],
}


@pytest.fixture(scope="module")
def tokenizer(demo_checkpoint: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(demo_checkpoint)


@pytest.fixture(scope="module")
def written(demo_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = write_tokenizer_info(demo_checkpoint, tmp_path_factory.mktemp("info") / FILE_NAME)
    return json.loads(path.read_text(encoding="utf-8"))


def as_the_cpp_backend_reads_it(info: dict) -> xgr.TokenizerInfo:
    """What TensorRT-LLM's guided decoder builds from the file: metadata detected from the backend
    string, then the vocabulary with the stop tokens."""
    metadata = xgr.TokenizerInfo._detect_metadata_from_hf(info["tokenizer_str"])
    return xgr.TokenizerInfo(
        info["encoded_vocab"],
        metadata["vocab_type"],
        stop_token_ids=info["stop_token_ids"],
        add_prefix_space=metadata["add_prefix_space"],
    )


def test_the_file_has_the_keys_the_backend_reads(written: dict, tokenizer) -> None:
    assert set(written) == {"encoded_vocab", "tokenizer_str", "stop_token_ids"}
    assert written["stop_token_ids"] == [tokenizer.eos_token_id]
    backend = json.loads(written["tokenizer_str"])  # the serialized tokenizers backend
    assert (
        backend["model"]["type"]
        == json.loads(tokenizer.backend_tokenizer.to_str())["model"]["type"]
    )


def test_vocabulary_index_is_the_token_id(written: dict, tokenizer) -> None:
    vocab = tokenizer.get_vocab()
    encoded = written["encoded_vocab"]
    assert len(encoded) == max(vocab.values()) + 1
    for token, token_id in vocab.items():
        assert encoded[token_id] == token
    ids = tokenizer.encode('{"sky": "rain"}', add_special_tokens=False)
    assert "".join(encoded[i] for i in ids) == "".join(tokenizer.convert_ids_to_tokens(ids))


def test_xgrammar_reads_it_like_the_tokenizer_itself(written: dict, tokenizer) -> None:
    from_file = as_the_cpp_backend_reads_it(written)
    from_hf = xgr.TokenizerInfo.from_huggingface(tokenizer)
    assert from_file.vocab_type == from_hf.vocab_type
    assert from_file.add_prefix_space == from_hf.add_prefix_space
    assert from_file.decoded_vocab == from_hf.decoded_vocab
    assert from_file.stop_token_ids == [tokenizer.eos_token_id]


def test_a_schema_compiles_and_is_enforced_with_it(written: dict, tokenizer) -> None:
    compiler = xgr.GrammarCompiler(as_the_cpp_backend_reads_it(written))
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)

    matcher = xgr.GrammarMatcher(compiled)
    answer = json.dumps({"sky": "rain", "windy": False})  # xgrammar: ", " and ": "
    for token_id in tokenizer.encode(answer, add_special_tokens=False):
        assert matcher.accept_token(token_id)
    assert matcher.accept_token(tokenizer.eos_token_id)
    assert matcher.is_terminated()

    wrong = xgr.GrammarMatcher(compiled)
    ids = tokenizer.encode('{"sky": "snow"}', add_special_tokens=False)
    assert not all(wrong.accept_token(token_id) for token_id in ids)


def test_a_tokenizer_without_a_backend_string_is_refused() -> None:
    slow = ByT5Tokenizer()  # pure Python, no tokenizer.json
    with pytest.raises(TokenizerInfoError, match="no tokenizer.json backend"):
        tokenizer_info(slow)
