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
        assert row["requests"] == 8 and row["tokens"] > 0 and row["wall_s"] > 0
        # The JSON keeps the figures as measured: the rate is the tokens over that very time.
        assert row["tok_s"] == pytest.approx(row["tokens"] / row["wall_s"])
    lockstep, staggered = (row["tok_s"] for row in result["rows"])
    assert result["staggered_over_lockstep"] == pytest.approx(staggered / lockstep)
    assert result["device"] == "cpu"
    assert "staggered / lockstep" in capsys.readouterr().out
