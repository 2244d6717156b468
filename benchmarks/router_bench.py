#!/usr/bin/env python3
"""Replicas behind vllm-router: how much of each prompt a replica finds in its prefix cache, and
what that does to the time to first token, under round_robin, cache_aware and kv_aware.

Packs the demo model with its prefix cache (`--enable-kv-cache-reuse true`, blocks of
`--block-size` tokens), serves `--replicas` replicas (each with a BentoML home of its own and its
KV-cache events on a loopback port), and for each policy starts vllm-router in front of them and
runs the same kind of load: `--sessions` multi-turn sessions that share a system prompt of
`--prefix-tokens` token ids, `--concurrency` sessions at a time, each turn adding its own tokens
to the conversation (streamed /v1/completions with token ids). Every turn's TTFT and its
`cached_tokens` (the replica's reused prompt tokens) are recorded, and whether each follow-up
landed on its session's holder: the replica that served its previous turn, the only one whose
cache covers that turn's prompt (the system prompt is everywhere; `--turn-tokens` of a block or
more put older turns short of it). A policy blind to the cache lands there about one time in
`--replicas`. Each policy gets sessions of its own (another system prompt), so no policy starts
on the caches another filled. Needs the router (`scripts/install-router.sh`); every process
started is stopped.

    .venv/bin/python benchmarks/router_bench.py                    # 3 replicas, 32 sessions x 6 turns

Output: a table on stdout and benchmarks/results/router-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_clients import cached_prefix_turn, http_client
from benchmarks.bench_procs import ROOT, Processes, Service, run_record, write_result
from tensorrtllm_backend.triton.command import find_free_port

ROUTER = ROOT / ".router-venv" / "bin" / "vllm-router"
POLICIES = ("round_robin", "cache_aware", "kv_aware")


async def run_policy(url: str, model: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    system = rng.integers(10, 2000, size=args.prefix_tokens).tolist()
    sessions = [system + rng.integers(10, 2000, size=16).tolist() for _ in range(args.sessions)]
    ttfts: list[float] = []
    fractions: list[float] = []  # follow-up turns: cached tokens / prompt tokens
    on_holder: list[bool] = []  # follow-up turns: the previous turn's prompt found cached
    gate = asyncio.Semaphore(args.concurrency)

    async def session(prompt: list[int], client: Any) -> None:
        async with gate:
            held = 0  # the previous turn's prompt tokens, in full blocks
            for number in range(args.turns):
                ttft, cached = await cached_prefix_turn(client, url, model, prompt)
                ttfts.append(ttft)
                if number:
                    fractions.append(cached / len(prompt))
                    on_holder.append(cached >= held)
                held = len(prompt) // args.block_size * args.block_size
                prompt = prompt + rng.integers(10, 2000, size=args.turn_tokens).tolist()

    started = time.perf_counter()
    async with http_client(args.concurrency) as client:
        await asyncio.gather(*(session(prompt, client) for prompt in sessions))
    return {
        "wall_s": time.perf_counter() - started,
        "turns": len(ttfts),
        "cached_fraction": statistics.fmean(fractions),
        "holder_fraction": statistics.fmean(on_holder),
        "ttft_p50_ms": statistics.median(ttfts) * 1000,
        "ttft_p99_ms": (statistics.quantiles(ttfts, n=100)[-1] if len(ttfts) > 1 else ttfts[0])
        * 1000,
    }


def start_router(
    replicas: list[Service], endpoints: list[str], policy: str, model: str, args: argparse.Namespace,
    log_dir: Path,
) -> tuple[subprocess.Popen[bytes], str]:  # fmt: skip
    port = find_free_port()
    command = [
        str(ROUTER), "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
        "--worker-urls", *(replica.url for replica in replicas),
        "--worker-startup-timeout-secs", "120", "--worker-startup-check-interval", "1",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(find_free_port()),
    ]  # fmt: skip
    if policy == "kv_aware":
        for replica, endpoint in zip(replicas, endpoints, strict=True):
            command += ["--kv-event-source", f"{replica.url}={endpoint}"]
        command += ["--kv-event-block-size", str(args.block_size), "--kv-event-model", model]
    with (log_dir / f"router-{policy}.log").open("wb") as log:
        router = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if router.poll() is not None:
            raise RuntimeError(f"vllm-router ({policy}) exited; see {log_dir}")
        try:
            if httpx.get(f"{url}/readiness", timeout=2).status_code == 200:
                return router, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    router.send_signal(signal.SIGTERM)
    raise RuntimeError(f"vllm-router ({policy}) not ready")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=8, help="sessions at a time")
    parser.add_argument(
        "--prefix-tokens",
        type=int,
        default=1536,
        help="the shared system prompt (the demo model holds 2,048 positions)",
    )
    parser.add_argument("--turn-tokens", type=int, default=48, help="tokens each turn adds")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--demo-size", choices=["tiny", "1b"], default="tiny")
    parser.add_argument("--out", type=Path, help="JSON result path")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not ROUTER.exists():
        print(f"router_bench: {ROUTER} is missing: run scripts/install-router.sh", file=sys.stderr)
        return 2
    longest = args.prefix_tokens + 16 + args.turns * args.turn_tokens
    work_dir = Path(tempfile.mkdtemp(prefix="router-bench-"))
    results: list[dict[str, Any]] = []
    routers: list[subprocess.Popen[bytes]] = []
    try:
        with Processes(work_dir) as procs:
            model = procs.pack(
                "--demo", "--demo-size", args.demo_size, "--enable-kv-cache-reuse", "true",
                "--tokens-per-block", str(args.block_size), "--max-input-len", str(longest),
                "--max-seq-len", str(longest + 64), name="bench-router",
            )  # fmt: skip
            name = model.tag.split(":")[0]
            endpoints = [f"tcp://127.0.0.1:{find_free_port()}" for _ in range(args.replicas)]
            replicas = []
            for index, endpoint in enumerate(endpoints):
                # A BentoML home each (one serve empties its home's metrics directory at start),
                # sharing the model store.
                home = work_dir / f"home-{index}"
                home.mkdir()
                (home / "models").symlink_to(procs.bentoml_home / "models")
                env = {"TRTLLM_MODEL": model.tag, "TRTLLM_KV_EVENTS_ENDPOINT": endpoint,
                       "BENTOML_HOME": str(home)}  # fmt: skip
                replicas.append(
                    procs.spawn_service(f"replica-{index}", "service:TRTLLM", ROOT, env)
                )
            for replica in replicas:
                procs.wait_ready(replica)
            print(f"-- demo model ({args.demo_size}), {args.replicas} replicas, {args.sessions} "
                  f"sessions x {args.turns} turns, {args.prefix_tokens}-token system prompt, "
                  f"C={args.concurrency}", flush=True)  # fmt: skip
            for seed, policy in enumerate(args.policies.split(",")):
                router, url = start_router(replicas, endpoints, policy, name, args, procs.logs)
                routers.append(router)
                row = asyncio.run(run_policy(url, name, args, seed))
                row["policy"] = policy
                results.append(row)
                router.send_signal(signal.SIGTERM)
                router.wait(30)
                print(f"{policy:<12} cached {row['cached_fraction']:6.1%}  on holder "
                      f"{row['holder_fraction']:6.1%}  TTFT p50 "
                      f"{row['ttft_p50_ms']:7.1f} ms  p99 {row['ttft_p99_ms']:7.1f} ms", flush=True)  # fmt: skip
    except KeyboardInterrupt:
        print("\nrouter_bench: interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    finally:
        for router in routers:
            if router.poll() is None:
                router.kill()
        shutil.rmtree(work_dir, ignore_errors=True)
    print(f"\n{'policy':<12} {'cached':>8} {'on holder':>10} {'TTFT p50 ms':>12} "
          f"{'TTFT p99 ms':>12}")  # fmt: skip
    for row in results:
        print(f"{row['policy']:<12} {row['cached_fraction']:8.1%} {row['holder_fraction']:10.1%} "
              f"{row['ttft_p50_ms']:12.1f} {row['ttft_p99_ms']:12.1f}")  # fmt: skip
    result = {
        **run_record("router", args),
        "results": results,
    }
    print(f"\nresult: {write_result(result, args.out, 'router')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
