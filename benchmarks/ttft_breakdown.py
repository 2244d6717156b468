#!/usr/bin/env python3
"""Where a request's time to first token goes: the native stream against direct gRPC.

The service runs with a benchmark-only probe (benchmarks/ttft_probe/sitecustomize.py) that marks
each request's way through the worker: headers parsed by uvicorn, the request's task running,
our first middleware, the Triton call, the first response, the first HTTP body write. The engine
adds its own marks (arrival, scheduled, first token: `return_perf_metrics`), for the native
requests and for a bare gRPC client's alike. Both targets run the same closed-loop load against
the service's own tritonserver, in alternating rounds:

    .venv/bin/python benchmarks/ttft_breakdown.py                      # ITL 20 ms, C=128
    .venv/bin/python benchmarks/ttft_breakdown.py --itl-ms 20 --concurrency 32

Output: a table of segment medians and means per target, and a JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_clients
from benchmarks.bench_procs import BENCH_DIR, Processes, save_result, synthetic_parser
from benchmarks.bench_stats import RequestRecord, percentile
from benchmarks.stream_bench import ServedSynthetic, serve_synthetic
from benchmarks.ttft_probe import sitecustomize as probe

PROBE_DIR = BENCH_DIR / "ttft_probe"

# (what the time is spent on, from mark, to mark). A bare gRPC client's rows have only the marks
# from triton_call (its send) to first_response (its receipt), so only those segments apply.
SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("client send -> uvicorn parsed the headers", "t0", "headers"),
    ("uvicorn -> the request's task runs", "headers", "asgi"),
    ("BentoML's middlewares -> ours", "asgi", "middleware"),
    ("API handler, validation, tokenization -> Triton call", "middleware", "triton_call"),
    ("Triton call -> the engine has the request", "triton_call", "engine_arrival"),
    ("engine: waiting for its next step", "engine_arrival", "engine_scheduled"),
    ("engine: first step", "engine_scheduled", "engine_first_token"),
    ("first token -> its response read by the caller", "engine_first_token", "first_response"),
    ("detokenize, coalesce -> first HTTP body write", "first_response", "first_body"),
    ("HTTP body -> client", "first_body", "client_first"),
    ("time to first token (the client's)", "t0", "client_first"),
)


@dataclass(frozen=True, slots=True)
class SegmentStat:
    segment: str
    p50_ms: float | None
    mean_ms: float | None
    requests: int


def segment_stats(
    rows: Sequence[Mapping[str, float]],
    segments: Sequence[tuple[str, str, str]] = SEGMENTS,
) -> list[SegmentStat]:
    """Median and mean of each segment over the rows that have both of its marks."""
    stats = []
    for name, start, end in segments:
        spans = [(row[end] - row[start]) * 1000.0 for row in rows if start in row and end in row]
        mean = sum(spans) / len(spans) if spans else None
        stats.append(SegmentStat(name, percentile(spans, 50), mean, len(spans)))
    return stats


def format_breakdown(by_target: Mapping[str, list[SegmentStat]]) -> str:
    names = list(by_target)
    header = f"{'segment':<54}" + "".join(f"{name + ' p50/mean ms':>26}" for name in names)
    lines = [header, "-" * len(header)]
    for index, (segment, _, _) in enumerate(SEGMENTS):
        cells = []
        for name in names:
            stat = by_target[name][index]
            cells.append(
                f"{stat.p50_ms:>12.1f} / {stat.mean_ms:>8.1f}"
                if stat.p50_ms is not None and stat.mean_ms is not None
                else f"{'-':>23}"
            )
        lines.append(f"{segment:<54}" + "".join(f"{cell:>26}" for cell in cells))
    return "\n".join(lines)


# -- the bare gRPC client, with the engine's marks ----------------------------------------------
class ProbedDirect(bench_clients.GrpcDirect):
    """stream_bench's bare gRPC client (the service's own TritonLLMClient) asking for the
    engine's timestamps: the same marks from the Triton call to the first response, with nothing
    in front of the client."""

    def __init__(self, url: str, max_tokens: int, pad_id: int) -> None:
        super().__init__(url, max_tokens, pad_id)
        self.rows: list[dict[str, float]] = []

    async def __call__(self, prompt: bench_clients.PromptCase) -> RequestRecord:
        tensors, outputs = probe.with_perf_metrics(
            bench_clients.exact_length_tensors(prompt.ids, self.max_tokens, self.pad_id),
            bench_clients.DIRECT_OUTPUTS,
        )
        engine: dict[str, float] = {}
        offset_s = time.time() - time.perf_counter()
        record = await self.request(
            tensors, outputs, lambda result: probe.read_engine_marks(result, offset_s, engine)
        )
        if record.error is None and record.first_output is not None:
            self.rows.append(
                {"t0": record.start, "triton_call": record.start,
                 "first_response": record.first_output, "client_first": record.first_output,
                 **engine}
            )  # fmt: skip
        return record


# -- the run -----------------------------------------------------------------------------------
def read_probe_rows(path: Path, first_byte: Mapping[str, float]) -> list[dict[str, float]]:
    """The probe's rows with the client's marks (t0, first byte) joined in by the t0 header."""
    rows = []
    for line in path.read_text().splitlines():
        raw = json.loads(line)
        if "probe_error" in raw:
            raise RuntimeError(f"the probe could not hook into the service: {raw['probe_error']}")
        t0 = raw.pop("t0")
        row = {key: float(value) for key, value in raw.items()}
        row["t0"] = float(t0)
        if t0 in first_byte:
            row["client_first"] = first_byte[t0]
        rows.append(row)
    return rows


def failures(records: Sequence[RequestRecord]) -> int:
    return sum(1 for r in records if r.error is not None or r.short or r.mismatch)


async def measure(
    args: argparse.Namespace, served: ServedSynthetic, probe_log: Path
) -> dict[str, list[dict[str, float]]]:
    prompts = served.prompts
    direct = ProbedDirect(served.grpc_url, args.max_tokens, served.pad_id)
    first_byte: dict[str, float] = {}
    bad = 0
    try:
        async with bench_clients.http_client(args.concurrency) as client:
            native = bench_clients.TextStream(client, f"{served.service.url}/generate", args.max_tokens,
                                start_header=probe.T0_HEADER.decode())  # fmt: skip
            for request in (direct, native):  # warm-up, not recorded
                await bench_clients.run_load(request, prompts, min(16, args.requests), 16)
            direct.rows.clear()
            probe_log.write_text("")
            for index in range(args.rounds):
                for name, request in (("direct gRPC", direct), ("native", native)):
                    records, _ = await bench_clients.run_load(
                        request, prompts, args.requests, args.concurrency
                    )
                    bad += failures(records)
                    if request is native:  # the client's first byte, by the start it sent
                        first_byte.update(
                            (repr(r.start), r.first_output) for r in records if r.first_output
                        )
                    print(f"  round {index + 1}: {name} done", flush=True)
    finally:
        await direct.close()
    if bad:
        raise RuntimeError(f"{bad} requests failed or came back incomplete")
    native_rows = read_probe_rows(probe_log, first_byte)
    if not native_rows:
        raise RuntimeError("the probe recorded no request: uvicorn or the service changed under it")
    return {"native": native_rows, "direct gRPC": direct.rows}


def build_parser() -> argparse.ArgumentParser:
    parser = synthetic_parser(__doc__, 512, "requests per target and round")
    parser.add_argument("--concurrency", type=int, default=128, help="requests in flight")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per target")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.itl_ms < 0 or args.concurrency < 1 or args.requests < 1 or args.rounds < 1:
        print("ttft_breakdown: --itl-ms >= 0; concurrency, requests, rounds >= 1", file=sys.stderr)
        return 2
    work_dir = Path(tempfile.mkdtemp(prefix="ttft-breakdown-"))
    probe_log = work_dir / "probe.jsonl"
    started = time.perf_counter()
    label = f"ITL {args.itl_ms:g} ms, C={args.concurrency}, closed loop"
    try:
        with Processes(work_dir) as procs:
            served = serve_synthetic(
                procs, "bench-breakdown", itl_ms=args.itl_ms,
                max_batch_size=max(64, args.concurrency), max_tokens=args.max_tokens,
                service_name="probed",
                env={"PYTHONPATH": str(PROBE_DIR), probe.LOG_ENV: str(probe_log)},
            )  # fmt: skip
            print(f"-- {label}: {args.rounds} x {args.requests} requests per target", flush=True)
            rows = asyncio.run(measure(args, served, probe_log))
    except KeyboardInterrupt:
        print("\nttft_breakdown: interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    except Exception as error:
        print(f"ttft_breakdown: error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    by_target = {name: segment_stats(target_rows) for name, target_rows in rows.items()}
    print(f"\n{label}")
    print(format_breakdown(by_target))
    segments = {name: [asdict(stat) for stat in stats] for name, stats in by_target.items()}
    save_result(args, {"segments": segments}, started, "ttft_breakdown")
    return 0


if __name__ == "__main__":
    sys.exit(main())
