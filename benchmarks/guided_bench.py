#!/usr/bin/env python3
"""Guided decoding's cost: generated tokens per second with and without a JSON schema.

Packs the demo model (the CPU engine with real logits), starts the service on it and sends the
same closed-loop load to POST /generate_text, unguided and guided by a JSON schema, in
interleaved rounds (so drift of a shared machine hits both alike). Every request runs to
max_tokens: the unguided ones ignore the end token, the guided ones get a schema whose strings
are long enough that the weak model rarely completes it first, so both produce the same tokens
and the rates compare decoding steps, not output lengths. Guided outputs are checked against the
schema when they complete; every process started is stopped.

    .venv/bin/python benchmarks/guided_bench.py                       # C=32, 3 rounds
    .venv/bin/python benchmarks/guided_bench.py --requests 64 --rounds 2 --max-tokens 48

Output: a table on stdout and benchmarks/results/guided-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_clients import http_client
from benchmarks.bench_procs import ROOT, Processes, run_record, write_result

PROMPTS = [
    "Describe today's weather as JSON:",
    "A user profile:",
    "The lighthouse keeper woke before dawn and wrote down",
    "Inventory record for the warehouse:",
]
# Long strings so that max_tokens, not the schema, ends a request; enums, booleans and a nested
# object so that the mask changes shape along the way.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 40, "maxLength": 200},
        "kind": {"enum": ["report", "note", "record"]},
        "done": {"type": "boolean"},
        "owner": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 20, "maxLength": 100},
                "admin": {"type": "boolean"},
            },
            "required": ["name", "admin"],
            "additionalProperties": False,
        },
        "notes": {"type": "string", "maxLength": 400},
    },
    "required": ["title", "kind", "done", "owner", "notes"],
    "additionalProperties": False,
}
MODES = ("unguided", "json_schema")


def body(mode: str, prompt: str, max_tokens: int, seed: int) -> dict[str, Any]:
    request: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "top_k": 40,
        "seed": seed,
    }
    if mode == "unguided":
        request["ignore_eos"] = True
    else:
        request["guided_decoding"] = {"type": "json_schema", "guide": json.dumps(SCHEMA)}
    return request


async def run_round(
    client: aiohttp.ClientSession, url: str, mode: str, args: argparse.Namespace, offset: int
) -> dict[str, Any]:
    """One closed-loop round of args.requests requests at args.concurrency in flight."""
    tokens: list[int] = []
    latencies: list[float] = []
    completed = invalid = 0
    next_index = 0

    async def worker() -> None:
        nonlocal next_index, completed, invalid
        while next_index < args.requests:
            index = next_index
            next_index += 1
            prompt = PROMPTS[index % len(PROMPTS)]
            started = time.perf_counter()
            async with client.post(
                f"{url}/generate_text", json=body(mode, prompt, args.max_tokens, offset + index)
            ) as response:
                result = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"{mode}: HTTP {response.status}: {result}")
            latencies.append(time.perf_counter() - started)
            tokens.append(result["usage"]["completion_tokens"])
            if mode != "unguided" and result["finish_reason"] == "stop":
                completed += 1
                invalid += not _follows_schema(result["text"])

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(args.concurrency, args.requests))))
    wall = time.perf_counter() - started
    return {
        "mode": mode,
        "requests": len(tokens),
        "tokens": sum(tokens),
        "wall_s": wall,
        "tok_s": sum(tokens) / wall,
        "mean_tokens": statistics.fmean(tokens),
        "p50_latency_s": statistics.median(latencies),
        "schema_completed": completed,
        "schema_invalid": invalid,
    }


def _follows_schema(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


async def measure(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    rounds = []
    async with http_client(args.concurrency) as client:
        for mode in MODES:  # warm-up: compiled schema, allocator, first-request costs
            warm = argparse.Namespace(**{**vars(args), "requests": args.concurrency})
            await run_round(client, url, mode, warm, 10_000)
        for number in range(args.rounds):
            order = MODES if number % 2 == 0 else MODES[::-1]
            for mode in order:
                row = await run_round(client, url, mode, args, number * args.requests)
                row["round"] = number
                rounds.append(row)
                print(
                    f"round {number} {mode:<11} {row['tok_s']:8.1f} tok/s "
                    f"({row['tokens']} tokens in {row['wall_s']:.1f} s)",
                    flush=True,
                )
    return rounds


def summarize(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    summary = {}
    for mode in MODES:
        rows = [row for row in rounds if row["mode"] == mode]
        summary[mode] = {
            "tok_s": sum(row["tokens"] for row in rows) / sum(row["wall_s"] for row in rows),
            "mean_tokens": statistics.fmean(row["mean_tokens"] for row in rows),
            "p50_latency_s": statistics.median(row["p50_latency_s"] for row in rows),
            "schema_completed": sum(row["schema_completed"] for row in rows),
            "schema_invalid": sum(row["schema_invalid"] for row in rows),
        }
    return summary


def format_summary(summary: dict[str, dict[str, float]]) -> str:
    base = summary["unguided"]["tok_s"]
    lines = [
        f"{'mode':<12} {'tok/s':>9} {'vs unguided':>12} {'tokens/req':>11} {'p50 s':>7} "
        f"{'completed':>10} {'invalid':>8}"
    ]
    for mode, row in summary.items():
        lines.append(
            f"{mode:<12} {row['tok_s']:9.1f} {row['tok_s'] / base:11.3f}x "
            f"{row['mean_tokens']:11.1f} {row['p50_latency_s']:7.2f} "
            f"{int(row['schema_completed']):10d} {int(row['schema_invalid']):8d}"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=96, help="requests per round and mode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--demo-size",
        choices=["tiny", "1b"],
        default="tiny",
        help="the demo model's size (1b: a 1B Llama's shapes; on a GPU host it decodes on CUDA)",
    )
    parser.add_argument("--goal", type=float, default=0.90, help="guided/unguided tok/s floor")
    parser.add_argument("--out", type=Path, help="JSON result path")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.concurrency, args.requests, args.rounds, args.max_tokens) < 1:
        print("guided_bench: every count must be at least 1", file=sys.stderr)
        return 2
    work_dir = Path(tempfile.mkdtemp(prefix="guided-bench-"))
    started = time.perf_counter()
    try:
        with Processes(work_dir) as procs:
            model = procs.pack(
                "--demo", "--demo-size", args.demo_size,
                "--max-batch-size", str(max(64, args.concurrency)),
                "--max-input-len", "256", "--max-seq-len", str(256 + args.max_tokens + 64),
                name="bench-guided",
            )  # fmt: skip
            service = procs.start_service(
                "guided", "service:TRTLLM", ROOT, {"TRTLLM_MODEL": model.tag}
            )
            print(f"-- demo model ({args.demo_size}), C={args.concurrency}, {args.rounds} x {args.requests} "
                  f"requests per mode, max_tokens {args.max_tokens}", flush=True)  # fmt: skip
            rounds = asyncio.run(measure(service.url, args))
    except KeyboardInterrupt:
        print("\nguided_bench: interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    summary = summarize(rounds)
    ratio = summary["json_schema"]["tok_s"] / summary["unguided"]["tok_s"]
    print()
    print(format_summary(summary))
    met = ratio >= args.goal and summary["json_schema"]["schema_invalid"] == 0
    print(f"\ngoal: guided >= {args.goal:.2f}x unguided, no invalid output: "
          f"{'met' if met else 'NOT met'} ({ratio:.3f}x)")  # fmt: skip
    result = {
        **run_record("guided", args),
        "schema": SCHEMA,
        "rounds": rounds,
        "summary": summary,
        "ratio": ratio,
        "goal_met": met,
        "duration_s": time.perf_counter() - started,
    }
    print(f"wrote {write_result(result, args.out, 'guided')}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
