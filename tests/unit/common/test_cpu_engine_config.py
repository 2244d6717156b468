"""CPU engine dir format: write, read back, validation, checkpoint packing."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tensorrtllm_backend.common.cpu_engine_config import load_engine_config, write_engine_dir


def test_synthetic_round_trip(tmp_path):
    out = write_engine_dir(
        tmp_path / "eng",
        mode="synthetic",
        vocab_size=500,
        eos_token_id=2,
        itl_ms=3.5,
        max_batch_size=8,
        max_input_len=100,
        max_seq_len=150,
    )
    data = json.loads((out / "config.json").read_text())
    assert data["version"] == "cpu-engine-1"
    assert data["pretrained_config"]["mapping"]["world_size"] == 1
    config = load_engine_config(out)
    assert config.engine_dir == out.resolve()
    assert config.cpu_engine.mode == "synthetic"
    assert config.cpu_engine.itl_ms == 3.5
    assert config.build_config.max_batch_size == 8
    assert config.build_config.max_seq_len == 150
    assert config.pretrained_config.vocab_size == 500


def test_hf_checkpoint_is_packed_relative(tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (ckpt / "sub" / "w.bin").write_bytes(b"123")
    out = write_engine_dir(
        tmp_path / "eng", mode="hf", checkpoint_dir=ckpt, vocab_size=10, eos_token_id=2
    )
    config = load_engine_config(out)
    assert config.cpu_engine.checkpoint_dir == "checkpoint"
    assert (config.checkpoint_path() / "sub" / "w.bin").read_bytes() == b"123"
    # Relocatable: moving the engine dir keeps the checkpoint reachable.
    moved = out.rename(tmp_path / "moved")
    assert load_engine_config(moved).checkpoint_path() == (moved / "checkpoint").resolve()


def test_hf_without_packing_points_at_checkpoint(tmp_path):
    out = write_engine_dir(
        tmp_path / "eng",
        mode="hf",
        checkpoint_dir=tmp_path,
        vocab_size=10,
        eos_token_id=2,
        pack_checkpoint=False,
    )
    assert load_engine_config(out).checkpoint_path() == tmp_path.resolve()


def test_invalid_configs_are_rejected(tmp_path):
    with pytest.raises(ValueError):
        write_engine_dir(tmp_path / "a", mode="hf", vocab_size=10, eos_token_id=2)
    with pytest.raises(FileNotFoundError):
        load_engine_config(tmp_path / "missing")
    (tmp_path / "trt").mkdir()
    (tmp_path / "trt" / "config.json").write_text(json.dumps({"version": "0.19.0"}))
    with pytest.raises(ValueError, match="not a CPU engine"):
        load_engine_config(tmp_path / "trt")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(
        json.dumps({"pretrained_config": {"vocab_size": 5}, "cpu_engine": {"mode": "hf"}})
    )
    with pytest.raises(ValidationError):
        load_engine_config(tmp_path / "bad")
