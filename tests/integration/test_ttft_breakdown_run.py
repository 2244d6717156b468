"""benchmarks/ttft_breakdown.py end to end on a tiny load: the probe hooks into the real
uvicorn / BentoML / service stack, every segment gets measured, and nothing is left running."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import ttft_breakdown

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_the_breakdown_measures_every_segment(tmp_path: Path) -> None:
    result_path = tmp_path / "breakdown.json"
    # As a user runs it: a process of its own, which owns the service and tritonserver it starts.
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ttft_breakdown.py"), "--itl-ms", "0",
         "--concurrency", "2", "--requests", "6", "--rounds", "1", "--max-tokens", "8",
         "--json", str(result_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "time to first token (the client's)" in run.stdout
    segments = json.loads(result_path.read_text())["segments"]
    native = {row["segment"]: row for row in segments["native"]}
    direct = {row["segment"]: row for row in segments["direct gRPC"]}
    for name, _, _ in ttft_breakdown.SEGMENTS:
        assert native[name]["requests"] == 6, name  # every mark of every request
        assert native[name]["p50_ms"] >= 0.0, name
    shared = ("Triton call -> the engine has the request", "time to first token (the client's)")
    for name in shared:
        assert direct[name]["requests"] == 6 and direct[name]["p50_ms"] > 0.0
    assert direct["client send -> uvicorn parsed the headers"]["requests"] == 0
