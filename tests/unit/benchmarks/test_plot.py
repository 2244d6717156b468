"""benchmarks/plot.py draws the benchmarks' JSON as PNG figures: each kind from a tiny result of
the shape its benchmark writes, and the figures docs/performance.md shows from the stored JSON."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from benchmarks import plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def expected_size() -> tuple[int, int]:
    return round(plot.SIZE_IN[0] * plot.DPI), round(plot.SIZE_IN[1] * plot.DPI)


def record(target: str, itl_ms: float, concurrency: int, tok_s: float, ttft: float) -> dict:
    """One target's figures in one cell, as stream_bench.py writes them."""
    return {
        "target": target,
        "cell": f"ITL {itl_ms:g} ms, C={concurrency}",
        "concurrency": concurrency,
        "tokens_per_s": tok_s,
        "ttft_ms": {"avg": ttft, "p50": ttft, "p99": 2 * ttft},
    }


def stream_bench_result() -> dict[str, Any]:
    return {
        "created": "2026-01-02T03:04:05+00:00",
        "results": [
            record(target, 20, concurrency, rate * concurrency, ttft + concurrency)
            for target, rate, ttft in (("grpc_direct", 50.0, 5.0), ("native[direct]", 45.0, 9.0))
            for concurrency in (32, 1, 8)
        ],
    }


def ab_result(workers: int, candidate_rates: list[float]) -> dict[str, Any]:
    """An ab.py sitting: every target's summary per round."""

    def rounds(rates: list[float], ttft: float) -> list[dict]:
        return [
            {"tokens_per_s": rate, "ttft_ms": {"p50": ttft + i}} for i, rate in enumerate(rates)
        ]

    direct = [100.0] * len(candidate_rates)
    return {
        "settings": {"workers": workers, "itl_ms": 20.0, "concurrency": 128},
        "rounds": {
            "grpc_ensemble": rounds([90.0] * len(direct), 50.0),
            "grpc_direct": rounds(direct, 10.0),
            "base": rounds([95.0] * len(direct), 30.0),
            "candidate": rounds(candidate_rates, 20.0),
        },
    }


def lines(figure: Any) -> list[list[tuple[str, list[float]]]]:
    """Per panel: each plotted line's label and y values (the spread bars left out)."""
    return [
        [
            (line.get_label(), [float(y) for y in line.get_ydata()])
            for line in axes.get_lines()
            if not line.get_label().startswith("_")
        ]
        for axes in figure.axes
    ]


def test_throughput_and_ttft_against_concurrency(tmp_path: Path) -> None:
    source = tmp_path / "stream.json"
    source.write_text(json.dumps(stream_bench_result()))
    out = tmp_path / "figures" / "concurrency.png"

    assert plot.main(["concurrency", str(source), "--out", str(out)]) == 0

    assert png_size(out) == expected_size()
    chart = plot.concurrency_chart(json.loads(source.read_text()))
    assert [(s.label, s.x) for s in chart.series] == [
        ("direct gRPC (tensorrt_llm)", [1, 8, 32]),
        ("/generate", [1, 8, 32]),
    ]
    assert chart.series[1].tokens_per_s == [45.0, 360.0, 1440.0]
    assert chart.series[1].ttft_p50_ms == [10.0, 17.0, 41.0]
    assert "ITL 20 ms" in chart.title and "2026-01-02" in chart.title
    figure = plot.draw(chart, tmp_path / "again.png")
    rate_panel, ttft_panel = lines(figure)
    assert rate_panel == [
        ("direct gRPC (tensorrt_llm)", [50.0, 400.0, 1600.0]),
        ("/generate", [45.0, 360.0, 1440.0]),
    ]
    assert [label for label, _ in ttft_panel] == ["direct gRPC (tensorrt_llm)", "/generate"]


def test_gpu_host_cells_are_one_series_per_worker_count() -> None:
    one = stream_bench_result()
    data = {"cells": {"workers=1": one, "workers=4": one}}
    labels = [series.label for series in plot.concurrency_chart(data).series]
    assert labels == [
        "direct gRPC (tensorrt_llm), workers 1",
        "/generate, workers 1",
        "direct gRPC (tensorrt_llm), workers 4",
        "/generate, workers 4",
    ]


def test_the_gpu_host_workers_phase(tmp_path: Path) -> None:
    rows = [
        {"workers": w, "target": t, "tokens_per_s": 1000.0 * w, "ttft_p50_ms": 100.0 / w}
        for w in (4, 1, 2)
        for t in ("grpc_direct", "native", "openai")
    ]
    data = {
        "date": "2026-01-02 03:04:05 UTC",
        "machine": {"cpus": 16, "gpu": "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"},
        "settings": {"itl_ms": 5.0, "concurrency": 512},
        "workers": rows,
    }
    out = tmp_path / "workers.png"
    figure = plot.draw(plot.workers_chart(data), out)

    assert png_size(out) == expected_size()
    rate_panel, _ = lines(figure)
    assert rate_panel == [
        ("direct gRPC (tensorrt_llm)", [1000.0, 2000.0, 4000.0]),
        ("/generate", [1000.0, 2000.0, 4000.0]),
        ("/v1/completions", [1000.0, 2000.0, 4000.0]),
    ]
    assert plot.workers_chart(data).title == (
        "Service against worker count (ITL 5 ms, C=512), 2026-01-02, NVIDIA H100 80GB HBM3"
    )


def test_one_ab_sitting_round_by_round(tmp_path: Path) -> None:
    out = tmp_path / "rounds.png"
    figure = plot.draw(plot.rounds_chart(ab_result(1, [98.0, 99.0, 97.0])), out)

    assert png_size(out) == expected_size()
    rate_panel, ttft_panel = lines(figure)
    assert [label for label, _ in rate_panel] == [
        "gRPC to the ensemble",
        "direct gRPC (tensorrt_llm)",
        "/generate, base",
        "/generate, candidate",
    ]
    assert rate_panel[3][1] == [98.0, 99.0, 97.0]
    assert ttft_panel[3][1] == [20.0, 21.0, 22.0]
    assert list(figure.axes[0].get_xticks()) == [1, 2, 3]


def test_ab_sittings_against_workers_are_medians_of_the_rounds(tmp_path: Path) -> None:
    sittings = [ab_result(4, [99.0, 97.0, 101.0]), ab_result(1, [90.0, 96.0, 93.0])]
    paths = []
    for index, sitting in enumerate(sittings):
        paths.append(tmp_path / f"ab-{index}.json")
        paths[-1].write_text(json.dumps(sitting))
    out = tmp_path / "ab-workers.png"

    assert plot.main(["ab-workers", *map(str, paths), "--out", str(out)]) == 0

    assert png_size(out) == expected_size()
    candidate, ensemble = plot.ab_workers_chart(sittings).series
    assert candidate.label == "/generate (the candidate)"
    assert candidate.x == [1, 4]
    assert candidate.tokens_per_s == pytest.approx([0.93, 0.99])
    assert candidate.tokens_spread is not None
    assert [bound for pair in candidate.tokens_spread for bound in pair] == pytest.approx(
        [0.90, 0.96, 0.97, 1.01]
    )
    assert candidate.ttft_p50_ms == [10.0, 10.0]  # candidate − direct, round by round
    assert ensemble.tokens_per_s == pytest.approx([0.9, 0.9])


def test_a_file_of_another_shape_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "other.json"
    source.write_text(json.dumps({"rows": []}))
    assert plot.main(["workers", str(source), "--out", str(tmp_path / "x.png")]) == 1
    assert not (tmp_path / "x.png").exists()


def test_the_documents_figures_draw_from_the_stored_json(tmp_path: Path) -> None:
    written = plot.draw_docs(figures=tmp_path)

    assert [path.name for path in written] == [name for name, *_ in plot.DOC_FIGURES]
    for path in written:
        assert png_size(path) == expected_size()
        assert (plot.FIGURES / path.name).is_file(), f"docs/figures/{path.name} is not drawn"
