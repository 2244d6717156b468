#!/usr/bin/env python3
"""Time to first token with open-loop arrivals: direct gRPC, native and OpenAI streaming.

`stream_bench.py` drives a closed loop (a new request when one ends), which on a step-based
engine locks arrivals to the step's phase and can hide or inflate the proxy's own TTFT by most of
a step. Here requests arrive as a Poisson process, at a rate that keeps --in-flight requests
running on average, and all three targets use the same tritonserver (the service's own):

    .venv/bin/python benchmarks/ttft_open_loop.py                       # ITL 20 ms, 32 in flight
    .venv/bin/python benchmarks/ttft_open_loop.py --itl-ms 10 --in-flight 64 --requests 600

Keep the offered load below what the machine sustains (see stream_bench's tokens/s): past it an
open loop queues without bound and TTFT only measures the queue. Output: a table and a JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_clients
from benchmarks.bench_procs import Processes, save_result, synthetic_parser
from benchmarks.bench_stats import TargetSummary, add_ratios, format_table, summarize
from benchmarks.stream_bench import openai_model_name, serve_synthetic


def build_parser() -> argparse.ArgumentParser:
    parser = synthetic_parser(__doc__, 300, "requests per target")
    parser.add_argument("--in-flight", type=int, default=32, help="requests running on average")
    parser.add_argument("--seed", type=int, default=5, help="seed of the arrival times")
    return parser


async def measure_all(
    args: argparse.Namespace, service_url: str, grpc_url: str, prompts: list[bench_clients.PromptCase],
    pad_id: int, label: str,
) -> list[TargetSummary]:  # fmt: skip
    # Each request lasts about max_tokens steps: this rate keeps --in-flight of them running.
    rate = args.in_flight / (args.max_tokens * args.itl_ms / 1000.0)
    summaries = []
    direct = bench_clients.GrpcDirect(grpc_url, args.max_tokens, pad_id)
    try:
        async with bench_clients.http_client(4 * args.in_flight) as client:
            model = await openai_model_name(service_url)
            targets: list[tuple[str, bench_clients.RequestFn]] = [("grpc_direct", direct)] + [
                (
                    f"{api}[direct]",
                    bench_clients.service_request(api, client, service_url, model, args.max_tokens),
                )
                for api in ("native", "openai")
            ]
            for name, request in targets:
                await bench_clients.run_open_loop(
                    request, prompts, 8, rate, seed=args.seed + 1
                )  # warm-up
                records, wall = await bench_clients.run_open_loop(request, prompts, args.requests, rate,
                                                    seed=args.seed)  # fmt: skip
                summary = summarize(name, label, args.in_flight, records, wall)
                summaries.append(summary)
                print(
                    f"  {name:<16} TTFT p50 {summary.ttft_ms.p50 or 0:6.1f} ms  p99 "
                    f"{summary.ttft_ms.p99 or 0:6.1f} ms  errors {summary.errors}  "
                    f"short {summary.short}",
                    flush=True,
                )
    finally:
        await direct.close()
    return summaries


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.itl_ms <= 0 or args.in_flight < 1 or args.requests < 1:
        print("ttft_open_loop: --itl-ms > 0, --in-flight >= 1, --requests >= 1", file=sys.stderr)
        return 2
    label = f"ITL {args.itl_ms:g} ms, ~{args.in_flight} in flight, open loop"
    work_dir = Path(tempfile.mkdtemp(prefix="ttft-open-loop-"))
    started = time.perf_counter()
    try:
        with Processes(work_dir) as procs:
            served = serve_synthetic(
                procs, "bench-open-loop", itl_ms=args.itl_ms,
                max_batch_size=max(64, 4 * args.in_flight), max_tokens=args.max_tokens,
            )  # fmt: skip
            print(f"-- {label}: {args.requests} requests per target", flush=True)
            summaries = asyncio.run(
                measure_all(
                    args, served.service.url, served.grpc_url, served.prompts, served.pad_id, label
                )
            )
    except KeyboardInterrupt:
        print("\nttft_open_loop: interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    add_ratios(summaries)
    print()
    print(format_table(summaries))
    save_result(args, {"results": [s.as_dict() for s in summaries]}, started, "ttft_open_loop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
