"""benchmarks/hf_engine_bench.py runs end to end on a tiny load: both arrival patterns, every
round, a rate from the tokens the engine produced, and its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from benchmarks import hf_engine_bench


def test_a_tiny_run_measures_both_patterns(tmp_path: Path, capsys) -> None:
    out = tmp_path / "result.json"
    args = ["--device", "cpu", "--concurrency", "4", "--requests", "8", "--max-tokens", "8",
            "--rounds", "1", "--json", str(out)]  # fmt: skip
    assert hf_engine_bench.main(args) == 0
    result = json.loads(out.read_text())
    assert [row["pattern"] for row in result["rows"]] == ["lockstep", "staggered"]
    for row in result["rows"]:
        assert row["requests"] == 8 and row["tokens"] > 0
        assert row["tok_s"] == pytest.approx(row["tokens"] / row["wall_s"], rel=0.01)
    assert result["device"] == "cpu"
    assert "staggered / lockstep" in capsys.readouterr().out
