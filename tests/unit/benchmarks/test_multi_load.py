"""The multi-process load generator's split of requests and streams, and the GPU-host tables'
per-token CPU figures."""

from __future__ import annotations

import pytest

from benchmarks.bench_stats import RequestRecord, summarize
from benchmarks.gpu_host import row
from benchmarks.multi_load import _split


@pytest.mark.parametrize(("total", "parts"), [(512, 6), (2048, 4), (7, 3), (3, 3)])
def test_split_covers_the_total_evenly(total: int, parts: int) -> None:
    shares = _split(total, parts)
    assert len(shares) == parts and sum(shares) == total
    assert max(shares) - min(shares) <= 1


def test_row_gives_cpu_per_token_and_cores_per_10k() -> None:
    records = [
        RequestRecord(start=0.0, end=2.0, first_output=0.1, last_output=2.0, tokens=100,
                      expected_tokens=100)
        for _ in range(10)
    ]  # fmt: skip
    summary = summarize("native", "cell", 10, records, wall_s=2.0)
    result = row(summary, {"service": 0.5}, workers=2)
    # 1000 tokens in 2 s (500 tok/s) for 0.5 CPU s: 500 us per token, 0.25 cores -> 5 per 10k.
    assert result["cpu_us_per_token"] == {"service": 500.0}
    assert result["service_cores_per_10k_tok_s"] == pytest.approx(5.0)
    assert result["workers"] == 2 and result["tokens_per_s"] == pytest.approx(500.0)
