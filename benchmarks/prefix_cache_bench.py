#!/usr/bin/env python3
"""The prefix cache's effect: time to first token of follow-up requests that share a long prefix.

Packs the demo model (the CPU engine with real logits; `--demo-size 1b` for a 1B Llama's
shapes) twice, with the prefix cache (`--enable-kv-cache-reuse true`) and without, serves both,
and runs the same sessions on each in alternating rounds (drift of a shared machine hits both
alike): every session sends a prompt of `--prefix-tokens` token ids and then `--turns` follow-ups
that extend it, each streamed through /v1/completions; the follow-ups' TTFT and their
`cached_tokens` are recorded. Every process started is stopped.

    .venv/bin/python benchmarks/prefix_cache_bench.py            # 1,024-token prefix, 3 rounds

Output: a table on stdout and benchmarks/results/prefix-cache-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_clients import cached_prefix_turn, http_client
from benchmarks.bench_procs import ROOT, Processes, run_record, write_result

MODES = ("reuse", "no-reuse")


async def run_round(url: str, model: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    ttfts: list[float] = []
    cached: list[int] = []
    async with http_client(1) as client:
        for _ in range(args.sessions):
            prompt = rng.integers(10, 2000, size=args.prefix_tokens).tolist()
            await cached_prefix_turn(client, url, model, prompt)  # the first turn fills the cache
            for _ in range(args.turns):
                prompt = prompt + rng.integers(10, 2000, size=args.turn_tokens).tolist()
                ttft, reused = await cached_prefix_turn(client, url, model, prompt)
                ttfts.append(ttft)
                cached.append(reused)
    return {
        "ttft_p50_ms": statistics.median(ttfts) * 1000,
        "ttft_p90_ms": (statistics.quantiles(ttfts, n=10)[-1] if len(ttfts) > 1 else ttfts[0])
        * 1000,
        "cached_fraction": statistics.fmean(
            c / (args.prefix_tokens + (i % args.turns) * args.turn_tokens)
            for i, c in enumerate(cached)
        ),
        "follow_ups": len(ttfts),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--turn-tokens", type=int, default=32, help="tokens each turn adds")
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--demo-size", choices=["tiny", "1b"], default="tiny")
    parser.add_argument("--out", type=Path, help="JSON result path")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    longest = args.prefix_tokens + args.turns * args.turn_tokens
    work_dir = Path(tempfile.mkdtemp(prefix="prefix-cache-bench-"))
    rounds: list[dict[str, Any]] = []
    try:
        with Processes(work_dir) as procs:
            urls = {}
            for mode in MODES:
                reuse = "true" if mode == "reuse" else "false"
                model = procs.pack(
                    "--demo", "--demo-size", args.demo_size, "--enable-kv-cache-reuse", reuse,
                    "--max-input-len", str(longest), "--max-seq-len", str(longest + 64),
                    name=f"bench-prefix-{mode}",
                )  # fmt: skip
                service = procs.start_service(
                    mode, "service:TRTLLM", ROOT, {"TRTLLM_MODEL": model.tag}
                )
                urls[mode] = (service.url, model.tag.split(":")[0])
            print(f"-- demo model ({args.demo_size}), {args.sessions} sessions x {args.turns} "
                  f"follow-ups, {args.prefix_tokens}-token prefix, {args.rounds} rounds",
                  flush=True)  # fmt: skip
            for number in range(args.rounds):
                for mode in MODES if number % 2 == 0 else MODES[::-1]:
                    row = asyncio.run(run_round(*urls[mode], args, seed=number))
                    row.update(mode=mode, round=number)
                    rounds.append(row)
                    print(f"round {number} {mode:<9} TTFT p50 {row['ttft_p50_ms']:7.1f} ms, "
                          f"cached {row['cached_fraction']:.0%}", flush=True)  # fmt: skip
    except KeyboardInterrupt:
        print("\nprefix_cache_bench: interrupted; every process it started is stopped",
              file=sys.stderr)  # fmt: skip
        return 130
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    summary = {
        mode: {
            key: statistics.median(row[key] for row in rounds if row["mode"] == mode)
            for key in ("ttft_p50_ms", "ttft_p90_ms", "cached_fraction")
        }
        for mode in MODES
    }
    print(f"\n{'mode':<10} {'TTFT p50 ms':>12} {'TTFT p90 ms':>12} {'cached':>7}")
    for mode, row in summary.items():
        print(f"{mode:<10} {row['ttft_p50_ms']:12.1f} {row['ttft_p90_ms']:12.1f} "
              f"{row['cached_fraction']:6.0%}")  # fmt: skip
    result = {
        **run_record("prefix-cache", args),
        "rounds": rounds,
        "summary": summary,
    }
    print(f"\nresult: {write_result(result, args.out, 'prefix-cache')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
