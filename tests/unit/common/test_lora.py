"""LoRA adapters: validation of TensorRT-LLM's converted format, stable task ids, the tensors a
request carries on first use and after, and packing rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tensorrtllm_backend.common.engine_config import EngineInfo
from tensorrtllm_backend.common.lora import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    LoraAdapter,
    LoraError,
    LoraRegistry,
    check_adapter_dir,
    task_id_for,
)
from tensorrtllm_backend.packing.engine_packing import PackError, _check_loras
from tensorrtllm_backend.serving.schemas import SamplingParams
from tensorrtllm_backend.serving.translation import LoraTensors
from tensorrtllm_backend.serving.triton_paths.direct import TokenIds, direct_tensors
from tensorrtllm_backend.serving.triton_paths.text import text_tensors
from tests.lora_helpers import write_adapter


def engine(kind: str = "tensorrt_llm", lora: bool = True) -> EngineInfo:
    return EngineInfo(
        kind=kind, path=Path("/e"), max_batch_size=8, max_input_len=16, max_seq_len=32,
        lora_enabled=lora,
    )  # fmt: skip


def test_converted_adapter_is_accepted_with_or_without_leading_dim(tmp_path: Path) -> None:
    assert check_adapter_dir(write_adapter(tmp_path / "a")) == (4, 32)
    assert check_adapter_dir(write_adapter(tmp_path / "b", leading_one=False)) == (4, 32)


def test_missing_file_and_mismatched_rows_are_named(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(LoraError, match=WEIGHTS_FILE):
        check_adapter_dir(tmp_path / "empty")
    bad = write_adapter(tmp_path / "bad")
    np.save(bad / CONFIG_FILE, np.zeros((1, 3, 3), dtype=np.int32))
    with pytest.raises(LoraError, match="4 rows but config has 3"):
        check_adapter_dir(bad)
    np.save(bad / CONFIG_FILE, np.zeros((1, 4, 2), dtype=np.int32))
    with pytest.raises(LoraError, match=r"config \[N, 3\]"):
        check_adapter_dir(bad)


def test_task_ids_are_stable_and_distinct() -> None:
    assert task_id_for("sql") == task_id_for("sql")
    assert task_id_for("sql") != task_id_for("chat")
    assert task_id_for("sql") > 0


def test_first_request_carries_weights_later_ones_only_the_id(tmp_path: Path) -> None:
    write_adapter(tmp_path / "loras" / "sql")
    registry = LoraRegistry.from_model(tmp_path)
    adapter = registry.get("sql")
    assert isinstance(adapter, LoraAdapter) and registry.names() == ["sql"]
    assert registry.needs_weights(adapter)
    weights, config = adapter.tensors()
    assert weights.shape == (1, 4, 32) and weights.dtype == np.float16
    assert config.shape == (1, 4, 3) and config.dtype == np.int32

    ids = TokenIds(prompt_ids=[1, 2, 3], end_id=2, pad_id=0)
    first = direct_tensors(SamplingParams(), ids, LoraTensors(adapter.task_id, weights, config))
    assert first["lora_task_id"].tolist() == [[adapter.task_id]]
    assert first["lora_task_id"].dtype == np.uint64
    assert np.array_equal(first["lora_weights"], weights)
    registry.mark_sent(adapter)
    assert not registry.needs_weights(adapter)
    later = text_tensors("hi", SamplingParams(), None, LoraTensors(adapter.task_id))
    assert "lora_weights" not in later and later["lora_task_id"].tolist() == [[adapter.task_id]]
    registry.mark_sent(adapter, sent=False)  # evicted from the backend's cache
    assert registry.needs_weights(adapter)


def test_packing_rejects_adapters_for_an_engine_without_the_lora_plugin(tmp_path: Path) -> None:
    adapter = write_adapter(tmp_path / "sql")
    with pytest.raises(PackError, match="--lora_plugin"):
        _check_loras(engine(lora=False), {"sql": adapter})
    assert _check_loras(engine(lora=True), {"sql": adapter}) == {"sql": adapter.resolve()}
    with pytest.raises(PackError, match="LoRA name"):
        _check_loras(engine(), {"a/b": adapter})
    # The CPU engine packs adapters (the API then explains it cannot apply them).
    assert _check_loras(engine(kind="cpu", lora=False), {"sql": adapter})
