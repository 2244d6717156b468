#!/usr/bin/env python3
"""PNG figures from the JSON the benchmarks write: tokens per second and TTFT p50 side by side.

    .venv/bin/python benchmarks/plot.py docs                               # redraw docs/figures/
    .venv/bin/python benchmarks/plot.py concurrency RESULT.json --out c.png  # stream_bench.py
    .venv/bin/python benchmarks/plot.py workers GPU_HOST.json --out w.png    # gpu_host.py, workers
    .venv/bin/python benchmarks/plot.py rounds AB.json --out r.png           # ab.py, one sitting
    .venv/bin/python benchmarks/plot.py ab-workers AB1.json AB4.json --out a.png  # ab.py sittings

Figures:
- concurrency: every target of a `stream_bench.py` result (or of the `cells` phase of
  `gpu_host.py`, one series per worker count) against the concurrency of its cells, one series
  per target and ITL;
- workers: the `workers` phase of `gpu_host.py`: direct gRPC, `/generate` and `/v1/completions`
  against the service's worker count;
- rounds: one `ab.py` sitting, every target in each of its alternating rounds;
- ab-workers: several `ab.py` sittings: the candidate service and gRPC to the ensemble against
  gRPC straight to `tensorrt_llm` in the same rounds, per worker count (median of the rounds,
  bars from the lowest to the highest round).
Nothing is measured here; the figures show what the JSON holds.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen
from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
FIGURES = ROOT / "docs" / "figures"
SIZE_IN = (10.0, 4.0)  # width, height in inches
DPI = 100  # so a figure is 1000 x 400 pixels

TARGET_NAMES = {
    "grpc_direct": "direct gRPC (tensorrt_llm)",
    "grpc_ensemble": "gRPC to the ensemble",
    "triton_generate_stream": "Triton generate_stream",
    "baseline_proxy": "baseline proxy",
    "native": "/generate",
    "openai": "/v1/completions",
    "candidate": "/generate, candidate",
    "base": "/generate, base",
}


@dataclass
class Series:
    """One line of a figure: x values with tokens/s and TTFT p50 (ms); optional spread bars."""

    label: str
    x: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    ttft_p50_ms: list[float] = field(default_factory=list)
    tokens_spread: list[tuple[float, float]] | None = None  # (low, high) per point
    ttft_spread: list[tuple[float, float]] | None = None

    def add(self, x: float, tokens_per_s: float, ttft_p50_ms: float) -> None:
        self.x.append(x)
        self.tokens_per_s.append(tokens_per_s)
        self.ttft_p50_ms.append(ttft_p50_ms)


@dataclass
class Chart:
    """What one figure shows: its series and the axes' labels."""

    title: str
    xlabel: str
    series: list[Series]
    tokens_label: str = "tokens/s"
    ttft_label: str = "TTFT p50 (ms)"
    categorical_x: bool = False  # round numbers, worker counts: ticks at the values only
    lines: bool = True  # False: points only (separate sittings, not a sweep)
    reference: tuple[float, float] | None = None  # dashed y lines: (tokens panel, TTFT panel)


def target_name(target: str) -> str:
    """`native[llmapi]` -> `/generate [llmapi]`; the direct route is the default and unnamed."""
    base, _, route = target.partition("[")
    route = route.rstrip("]")
    name = TARGET_NAMES.get(base, base)
    return f"{name} [{route}]" if route and route != "direct" else name


def load(path: Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a benchmark result (a JSON object)")
    return data


def machine_name(data: dict[str, Any]) -> str:
    """The GPU's name where the JSON records it (`gpu_host.py`), else its machine text, else ''."""
    machine = data.get("machine")
    if isinstance(machine, dict):
        gpu = str(machine.get("gpu") or "")
        match = re.match(r"GPU \d+: (.*?)(?: \(UUID.*)?$", gpu)
        if match:
            return match.group(1)
        return f"{machine['cpus']} cores" if machine.get("cpus") else ""
    return str(machine or "")


def default_title(data: dict[str, Any], what: str) -> str:
    date = str(data.get("date") or data.get("created") or "")[:10]
    return ", ".join(part for part in (what, date, machine_name(data)) if part)


ITL = re.compile(r"ITL ([\d.]+) ms")


def concurrency_chart(data: dict[str, Any], title: str | None = None) -> Chart:
    """A `stream_bench.py` result (`results`), or `gpu_host.py`'s `cells` (one result per worker
    count): each target against concurrency, one series per target, ITL and worker count."""
    if "results" in data:
        runs = {"": data}
    elif isinstance(data.get("cells"), dict):
        runs = data["cells"]  # {"workers=1": stream_bench result, ...}
    else:
        raise ValueError("no stream_bench results (`results`) or gpu_host cells (`cells`)")
    records = [(run, record) for run, result in runs.items() for record in result["results"]]
    itls = {ITL.search(record["cell"]).group(1) for _, record in records}
    series: dict[str, Series] = {}
    for run, record in sorted(records, key=lambda item: item[1]["concurrency"]):
        if not record.get("tokens_per_s") or record["ttft_ms"].get("p50") is None:
            continue
        parts = [target_name(record["target"])]
        if len(itls) > 1:
            parts.append(f"ITL {ITL.search(record['cell']).group(1)} ms")
        if len(runs) > 1:
            parts.append(run.replace("=", " "))
        label = ", ".join(parts)
        series.setdefault(label, Series(label)).add(
            record["concurrency"], record["tokens_per_s"], record["ttft_ms"]["p50"]
        )
    what = "Streams against concurrency"
    if len(itls) == 1:
        what += f" (ITL {itls.pop()} ms)"
    return Chart(title or default_title(data, what), "concurrency", list(series.values()))


def workers_chart(data: dict[str, Any], title: str | None = None) -> Chart:
    """`gpu_host.py`'s `workers` phase: each target against the service's worker count."""
    rows = data.get("workers")
    if not isinstance(rows, list) or not rows:
        raise ValueError("no gpu_host workers phase (`workers`)")
    series: dict[str, Series] = {}
    for row in sorted(rows, key=lambda row: row["workers"]):
        label = target_name(row["target"])
        series.setdefault(label, Series(label)).add(
            row["workers"], row["tokens_per_s"], row["ttft_p50_ms"]
        )
    settings = data.get("settings", {})
    what = "Service against worker count"
    if "itl_ms" in settings:
        what += f" (ITL {settings['itl_ms']:g} ms, C={settings['concurrency']})"
    return Chart(
        title or default_title(data, what),
        "BentoML workers (TRTLLM_WORKERS)",
        list(series.values()),
        categorical_x=True,
    )


def rounds_chart(data: dict[str, Any], title: str | None = None) -> Chart:
    """One `ab.py` sitting: every target in each alternating round."""
    rounds = data.get("rounds")
    if not isinstance(rounds, dict) or not rounds:
        raise ValueError("no ab.py rounds (`rounds`)")
    series = []
    for target, results in rounds.items():
        line = Series(target_name(target))
        for index, result in enumerate(results, start=1):
            if result.get("tokens_per_s") and result["ttft_ms"].get("p50") is not None:
                line.add(index, result["tokens_per_s"], result["ttft_ms"]["p50"])
        series.append(line)
    settings = data.get("settings", {})
    what = "ab.py rounds"
    if "itl_ms" in settings:
        what += (
            f" (ITL {settings['itl_ms']:g} ms, C={settings['concurrency']}, "
            f"{settings.get('workers', 1)} worker(s))"
        )
    return Chart(title or default_title(data, what), "round", series, categorical_x=True)


def _against(rounds: dict[str, Any], target: str, reference: str) -> tuple[list, list]:
    """Per round, as ab.py's table: tokens/s ratio and TTFT p50 difference (ms)."""
    rate, ttft = [], []
    for mine, theirs in zip(rounds[target], rounds[reference], strict=True):
        if mine.get("tokens_per_s") and theirs.get("tokens_per_s"):
            rate.append(mine["tokens_per_s"] / theirs["tokens_per_s"])
        a, b = mine["ttft_ms"].get("p50"), theirs["ttft_ms"].get("p50")
        if a is not None and b is not None:
            ttft.append(a - b)
    return rate, ttft


def ab_workers_chart(sittings: Sequence[dict[str, Any]], title: str | None = None) -> Chart:
    """Several `ab.py` sittings: the candidate's `/generate` and gRPC to the ensemble against
    gRPC straight to `tensorrt_llm`, per worker count. Sittings with the same worker count are
    drawn side by side."""
    pairs = (("candidate", "/generate (the candidate)"), ("grpc_ensemble", "gRPC to the ensemble"))
    series = {target: Series(label, [], [], [], [], []) for target, label in pairs}
    seen: dict[int, int] = {}
    for data in sorted(sittings, key=lambda data: data["settings"].get("workers", 1)):
        workers = data["settings"].get("workers", 1)
        offset = 0.12 * seen.get(workers, 0)  # a second sitting of the same count: beside it
        seen[workers] = seen.get(workers, 0) + 1
        for target, line in series.items():
            if target not in data["rounds"] or "grpc_direct" not in data["rounds"]:
                continue
            rate, ttft = _against(data["rounds"], target, "grpc_direct")
            line.add(workers + offset, statistics.median(rate), statistics.median(ttft))
            assert line.tokens_spread is not None and line.ttft_spread is not None
            line.tokens_spread.append((min(rate), max(rate)))
            line.ttft_spread.append((min(ttft), max(ttft)))
    return Chart(
        title or "ab.py sittings against worker count",
        "BentoML workers (TRTLLM_WORKERS)",
        [line for line in series.values() if line.x],
        tokens_label="tokens/s ÷ direct gRPC (median, min..max)",
        ttft_label="TTFT p50 − direct gRPC (ms)",
        categorical_x=True,
        lines=False,
        reference=(1.0, 0.0),
    )


def draw(chart: Chart, out: Path) -> Figure:
    """Two panels, tokens/s and TTFT p50, written to `out` as a PNG of 1000 x 400 pixels."""
    figure, (rate_axes, ttft_axes) = plt.subplots(1, 2, figsize=SIZE_IN, dpi=DPI)
    for line in chart.series:
        for axes, values, spread in (
            (rate_axes, line.tokens_per_s, line.tokens_spread),
            (ttft_axes, line.ttft_p50_ms, line.ttft_spread),
        ):
            style = "-" if chart.lines else "none"
            (drawn,) = axes.plot(line.x, values, marker="o", linestyle=style, label=line.label)
            if spread:
                low = [value - lo for value, (lo, _) in zip(values, spread, strict=True)]
                high = [hi - value for value, (_, hi) in zip(values, spread, strict=True)]
                axes.errorbar(
                    line.x, values, yerr=[low, high], fmt="none", capsize=3,
                    color=drawn.get_color(), label="_spread",
                )  # fmt: skip
    ticks = sorted({round(x) for line in chart.series for x in line.x})
    for axes, label in ((rate_axes, chart.tokens_label), (ttft_axes, chart.ttft_label)):
        axes.set_xlabel(chart.xlabel)
        axes.set_ylabel(label)
        axes.grid(True, alpha=0.3)
        if chart.categorical_x and ticks:
            axes.set_xticks(ticks)
        elif ticks and len(ticks) > 1 and ticks[-1] / max(ticks[0], 1) >= 8:
            axes.set_xscale("log", base=2)
    if chart.reference is None:
        rate_axes.set_ylim(bottom=0)
    else:
        for axes, y in zip((rate_axes, ttft_axes), chart.reference, strict=True):
            axes.axhline(y, color="grey", linestyle="--", linewidth=1)
    if chart.series:
        ttft_axes.legend(fontsize="small")
    figure.suptitle(chart.title)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png", metadata={"Software": None})
    plt.close(figure)
    return figure


# The figures docs/performance.md shows: file name, kind, JSON under docs/results/, title.
DOC_FIGURES: list[tuple[str, str, list[str], str]] = [
    (
        "gpu-host-itl5-c512-workers.png",
        "workers",
        ["gpu-host/synthetic-itl5-c512.json"],
        "GPU host, 2026-11-24, H100: ITL 5 ms, C=512, 8 engine instances",
    ),
    (
        "gpu-host-itl20-c128-ab-workers.png",
        "ab-workers",
        [
            "gpu-host/2026-11-27/ab-turns-w1.json",
            "gpu-host/2026-11-27/ab-rebalance-w4-1.json",
            "gpu-host/2026-11-27/ab-rebalance-w4-2.json",
            "gpu-host/2026-11-27/ab-rebalance-w4-3.json",
            "gpu-host/2026-11-27/ab-rebalance-w8.json",
        ],
        "GPU host, 2026-11-27, H200: ITL 20 ms, C=128, one ab.py sitting per point",
    ),
    (
        "dev-itl20-c128-ab-rounds.png",
        "rounds",
        ["dev/ab-rebalance-w1-vs-f57bb24.json"],
        "Development machine (2 cores), 2026-11-27: ITL 20 ms, C=128, ab.py rounds, 1 worker",
    ),
]


def chart_for(kind: str, paths: Sequence[Path], title: str | None = None) -> Chart:
    sittings = [load(path) for path in paths]
    if kind == "ab-workers":
        return ab_workers_chart(sittings, title)
    if len(sittings) != 1:
        raise ValueError(f"{kind} draws one JSON file, not {len(sittings)}")
    charts = {"concurrency": concurrency_chart, "workers": workers_chart, "rounds": rounds_chart}
    return charts[kind](sittings[0], title)


def draw_docs(results: Path = RESULTS, figures: Path = FIGURES) -> list[Path]:
    written = []
    for name, kind, paths, title in DOC_FIGURES:
        out = figures / name
        draw(chart_for(kind, [results / path for path in paths], title), out)
        written.append(out)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kind", choices=("docs", "concurrency", "workers", "rounds", "ab-workers"))
    parser.add_argument("json", nargs="*", type=Path, help="benchmark result files")
    parser.add_argument("--out", type=Path, help="the PNG to write (not with `docs`)")
    parser.add_argument("--title", help="the figure's title (default: from the JSON)")
    args = parser.parse_args(argv)
    if args.kind == "docs":
        if args.json or args.out:
            parser.error("`docs` takes no files: it draws docs/figures/ from docs/results/")
        for path in draw_docs():
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    if not args.json or not args.out:
        parser.error(f"`{args.kind}` needs JSON files and --out")
    try:
        chart = chart_for(args.kind, args.json, args.title)
    except (ValueError, KeyError) as error:
        print(f"plot: {error}", file=sys.stderr)
        return 1
    draw(chart, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
