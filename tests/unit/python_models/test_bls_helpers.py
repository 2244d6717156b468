"""Unit tests of the python models' helpers (tensorrtllm_backend.python_models.bls): parameters, the
postprocessing stream cache and the BLS text stream."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tiny_tokenizers import byte_level_bpe
from transformers import PreTrainedTokenizerFast

from tensorrtllm_backend.common.tokenization import IncrementalDetokenizer
from tensorrtllm_backend.python_models.bls.detok_cache import DetokenizerCache
from tensorrtllm_backend.python_models.bls.params import (
    engine_vocab_size,
    model_parameter,
    parse_bool,
    resolve_model_path,
    sibling_parameter,
)
from tensorrtllm_backend.python_models.bls.pipeline import (
    CLIENT_TO_ENGINE,
    SCALAR_ENGINE_INPUTS,
    TextStream,
)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    corpus = ["hello world, stop here. Grüße 日本"] * 10
    return byte_level_bpe(corpus, 300, bos_token="<s>", eos_token="</s>")


def test_model_parameter_treats_placeholders_as_unset() -> None:
    config = {
        "parameters": {
            "a": {"string_value": "${a}"},
            "b": {"string_value": ""},
            "c": {"string_value": " value "},
        }
    }
    assert model_parameter(config, "a") is None
    assert model_parameter(config, "b") is None
    assert model_parameter(config, "c") == "value"
    assert model_parameter(config, "missing") is None
    assert model_parameter({}, "a") is None


def test_parse_bool() -> None:
    assert parse_bool(None, True) is True
    assert parse_bool("FALSE", True) is False
    assert parse_bool("yes", False) is True
    with pytest.raises(ValueError, match="skip_special_tokens"):
        parse_bool("maybe", True, "skip_special_tokens")


def test_resolve_model_path(tmp_path: Path) -> None:
    repo_model = tmp_path / "repo" / "preprocessing"
    repo_model.mkdir(parents=True)
    (tmp_path / "tokenizer").mkdir()
    assert resolve_model_path("tokenizer", str(repo_model)) == tmp_path / "tokenizer"
    assert resolve_model_path(str(tmp_path / "x"), str(repo_model)) == tmp_path / "x"


def test_sibling_parameter_reads_both_text_formats(tmp_path: Path) -> None:
    bls = tmp_path / "tensorrt_llm_bls"
    bls.mkdir()
    pre = tmp_path / "preprocessing"
    pre.mkdir()
    (pre / "config.pbtxt").write_text(
        'parameters: {\n  key: "tokenizer_dir"\n  value: {\n    string_value: "/tok"\n  }\n}\n'
    )
    assert sibling_parameter(str(bls), "preprocessing", "tokenizer_dir") == "/tok"
    (pre / "config.pbtxt").write_text(
        'parameters {\n  key: "tokenizer_dir"\n  value {\n    string_value: "${tokenizer_dir}"\n'
        "  }\n}\n"
    )
    assert sibling_parameter(str(bls), "preprocessing", "tokenizer_dir") is None
    assert sibling_parameter(str(bls), "postprocessing", "tokenizer_dir") is None


def test_engine_vocab_size(tmp_path: Path) -> None:
    assert engine_vocab_size(None) is None
    assert engine_vocab_size(tmp_path) is None
    (tmp_path / "config.json").write_text('{"pretrained_config": {"vocab_size": 2048}}')
    assert engine_vocab_size(tmp_path) == 2048


def test_detokenizer_cache_lru_and_expiry(tokenizer) -> None:
    now = [0.0]
    cache = DetokenizerCache(
        lambda: IncrementalDetokenizer(tokenizer),
        max_entries=2,
        idle_seconds=10,
        clock=lambda: now[0],
    )
    first = cache.get("a")
    assert cache.get("a") is first
    cache.get("b")
    cache.get("a")  # "b" is now the least recently used
    cache.get("c")
    assert len(cache) == 2
    assert cache.get("a") is first
    now[0] = 11.0  # everything idle for longer than 10 s
    assert cache.get("a") is not first
    assert len(cache) == 1


def test_text_stream_stops_and_releases_held_text(tokenizer) -> None:
    ids = tokenizer.encode("hello world, stop here.", add_special_tokens=False)
    stream = TextStream(tokenizer, ["stop"])
    out = "".join(stream.feed([i]) for i in ids) + stream.finish()
    assert out == "hello world, "
    assert stream.stopped and stream.text == out

    stream = TextStream(tokenizer, ["here!"])
    out = "".join(stream.feed([i]) for i in ids) + stream.finish()
    assert out == "hello world, stop here." and not stream.stopped


def test_text_stream_multibyte(tokenizer) -> None:
    ids = tokenizer.encode("Grüße 日本", add_special_tokens=False)
    stream = TextStream(tokenizer)
    pieces = [stream.feed([i]) for i in ids]
    assert "".join(pieces) + stream.finish() == "Grüße 日本"
    assert all("\ufffd" not in p for p in pieces)


def test_engine_routing_tables() -> None:
    assert CLIENT_TO_ENGINE["stream"] == "streaming"
    assert CLIENT_TO_ENGINE["top_k"] == "runtime_top_k"
    assert CLIENT_TO_ENGINE["random_seed"] == "seed"
    assert "temperature" in SCALAR_ENGINE_INPUTS
    assert "lora_weights" not in SCALAR_ENGINE_INPUTS
