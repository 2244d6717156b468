#!/usr/bin/env python3
"""Scoring throughput: prompt log probs through the service vs Triton directly.

Packs the demo model (the CPU engine with real logits; `--demo-size 1b` for a 1B Llama's
shapes), starts the service on it and scores the same prompts of `--prompt-tokens` token ids in
two ways, in alternating rounds (drift of a shared machine hits both alike):

- `service`: POST /v1/completions with the token ids, `echo: true, logprobs: K, max_tokens: 0`,
  as an evaluation harness scores a continuation (the answer's JSON parsed);
- `triton`: the same scoring request straight to the service's own tritonserver over gRPC, to
  the `prompt_logprobs` model beside the engine (the service's own client, nothing in front).

Every answer is checked: one log prob per prompt token after the first. Every process started
is stopped.

    .venv/bin/python benchmarks/scoring_bench.py                   # 512 tokens, C=8, 3 rounds
    .venv/bin/python benchmarks/scoring_bench.py --prompts 64 --concurrency 16 --logprobs 5

Output: a table on stdout and benchmarks/results/scoring-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_clients import http_client
from benchmarks.bench_procs import ROOT, Processes, run_record, write_result
from tensorrtllm_backend.serving.triton_paths import PROMPT_OUTPUTS, PROMPT_SCORER
from tensorrtllm_backend.triton.client import TritonLLMClient
from tensorrtllm_backend.triton.command import find_free_port

MODES = ("service", "triton")
Score = Callable[[list[int]], Awaitable[int]]


def prompt_ids(count: int, tokens: int, vocab: int) -> list[list[int]]:
    """`count` distinct prompts of `tokens` ids (deterministic; no special tokens)."""
    rng = np.random.default_rng(0)
    return [rng.integers(3, vocab, size=tokens).tolist() for _ in range(count)]


async def run_round(
    score: Score, prompts: list[list[int]], concurrency: int
) -> dict[str, float | int]:
    """Score every prompt, `concurrency` at a time (closed loop)."""
    latencies: list[float] = []
    scored = 0
    queue = list(prompts)

    async def worker() -> None:
        nonlocal scored
        while queue:
            ids = queue.pop()
            started = time.perf_counter()
            count = await score(ids)  # awaited before the sum reads `scored`
            scored += count
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
    wall = time.perf_counter() - started
    return {
        "prompts": len(latencies),
        "scored_tokens": scored,
        "wall_s": wall,
        "prompts_s": len(latencies) / wall,
        "tokens_s": scored / wall,
        "p50_latency_s": statistics.median(latencies),
    }


def service_scorer(client: Any, url: str, model: str, k: int) -> Score:
    async def score(ids: list[int]) -> int:
        body = {"model": model, "prompt": ids, "echo": True, "logprobs": k, "max_tokens": 0}
        async with client.post(f"{url}/v1/completions", json=body) as response:
            answer = await response.json()
            if response.status != 200:
                raise RuntimeError(f"service: HTTP {response.status}: {answer}")
        values = answer["choices"][0]["logprobs"]["token_logprobs"]
        if len(values) != len(ids) or values[0] is not None:
            raise RuntimeError(f"service: {len(values)} log probs for {len(ids)} tokens")
        return len(values) - 1

    return score


def triton_scorer(client: TritonLLMClient, k: int) -> Score:
    count = 0

    async def score(ids: list[int]) -> int:
        nonlocal count
        count += 1
        tensors = {
            "input_ids": np.asarray(ids, dtype=np.int32),
            "top_log_probs": np.array([k], dtype=np.int32),
        }
        values: list[float] = []
        async for result in client.stream(PROMPT_SCORER, tensors, PROMPT_OUTPUTS, f"b{count}"):
            values = result.values(PROMPT_OUTPUTS[0]) or values
        if len(values) != len(ids) - 1:
            raise RuntimeError(f"triton: {len(values)} log probs for {len(ids)} tokens")
        return len(values)

    return score


async def measure(
    url: str, grpc_url: str, model: str, args: argparse.Namespace
) -> list[dict[str, Any]]:
    prompts = prompt_ids(args.prompts, args.prompt_tokens, args.vocab)
    triton = TritonLLMClient(grpc_url)
    rounds: list[dict[str, Any]] = []
    try:
        async with http_client(args.concurrency) as http:
            scorers = {
                "service": service_scorer(http, url, model, args.logprobs),
                "triton": triton_scorer(triton, args.logprobs),
            }
            for mode in MODES:  # warm-up: first-request costs on both paths
                await run_round(scorers[mode], prompts[: args.concurrency], args.concurrency)
            for number in range(args.rounds):
                for mode in MODES if number % 2 == 0 else MODES[::-1]:
                    row = await run_round(scorers[mode], prompts, args.concurrency)
                    row.update(mode=mode, round=number)
                    rounds.append(row)
                    print(f"round {number} {mode:<8} {row['prompts_s']:7.2f} prompts/s "
                          f"{row['tokens_s']:9.0f} tokens/s", flush=True)  # fmt: skip
    finally:
        await triton.close()
    return rounds


def summarize(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    summary = {}
    for mode in MODES:
        rows = [row for row in rounds if row["mode"] == mode]
        wall = sum(row["wall_s"] for row in rows)
        summary[mode] = {
            "prompts_s": sum(row["prompts"] for row in rows) / wall,
            "tokens_s": sum(row["scored_tokens"] for row in rows) / wall,
            "p50_latency_s": statistics.median(row["p50_latency_s"] for row in rows),
        }
    return summary


def format_summary(summary: dict[str, dict[str, float]]) -> str:
    base = summary["triton"]["tokens_s"]
    lines = [f"{'path':<9} {'prompts/s':>10} {'tokens/s':>10} {'vs triton':>10} {'p50 ms':>8}"]
    for mode, row in summary.items():
        lines.append(
            f"{mode:<9} {row['prompts_s']:10.2f} {row['tokens_s']:10.0f} "
            f"{row['tokens_s'] / base:9.3f}x {row['p50_latency_s'] * 1000:8.1f}"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=48, help="prompts per round and path")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--logprobs", type=int, default=1, help="alternatives per position")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=2048, help="prompt ids are drawn below it")
    parser.add_argument("--demo-size", choices=["tiny", "1b"], default="tiny")
    parser.add_argument("--out", type=Path, help="JSON result path")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.prompts, args.prompt_tokens - 1, args.concurrency, args.rounds) < 1:
        print("scoring_bench: every count must be at least 1 (prompts of 2+ tokens)",
              file=sys.stderr)  # fmt: skip
        return 2
    work_dir = Path(tempfile.mkdtemp(prefix="scoring-bench-"))
    try:
        with Processes(work_dir) as procs:
            model = procs.pack(
                "--demo", "--demo-size", args.demo_size,
                "--max-batch-size", str(max(64, args.concurrency)),
                "--max-input-len", str(args.prompt_tokens),
                "--max-seq-len", str(args.prompt_tokens + 64),
                name="bench-scoring",
            )  # fmt: skip
            grpc_port = find_free_port()
            service = procs.start_service(
                "scoring", "service:TRTLLM", ROOT,
                {"TRTLLM_MODEL": model.tag, "TRTLLM_TRITON_GRPC_PORT": str(grpc_port)},
            )  # fmt: skip
            print(f"-- demo model ({args.demo_size}), {args.prompts} prompts of "
                  f"{args.prompt_tokens} tokens, C={args.concurrency}, logprobs {args.logprobs}, "
                  f"{args.rounds} rounds", flush=True)  # fmt: skip
            name = model.tag.split(":")[0]
            rounds = asyncio.run(measure(service.url, f"127.0.0.1:{grpc_port}", name, args))
    except KeyboardInterrupt:
        print("\nscoring_bench: interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    summary = summarize(rounds)
    print()
    print(format_summary(summary))
    result = {
        **run_record("scoring", args),
        "rounds": rounds,
        "summary": summary,
    }
    path = write_result(result, args.out, "scoring")
    print(f"\nresult: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
