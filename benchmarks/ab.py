#!/usr/bin/env python3
"""A/B of the request path: a base git ref against the working tree (or another ref), measured in
alternating rounds in one sitting.

Each side gets a checkout of its own (a `git worktree`; the working tree as it is for the
candidate unless `--candidate` names a ref), packs the same synthetic-engine model with that
side's own `pack_model.py` and runs that side's `bentoml serve` with its default route. A third
tritonserver, with the whole model repository loaded, serves the references: gRPC straight to
the `ensemble` (text in, text out, what a client of Triton's own API pays) and gRPC straight to
`tensorrt_llm` (token ids, the floor); it runs this checkout's code on a model this checkout
packs. Every round measures each target once, in an order that alternates from round to round,
so the slow phases of a shared machine hit every side alike. The table gives each round's
figures and, per pair, the median ratio with its spread (min..max over rounds).

    .venv/bin/python benchmarks/ab.py --base ea66ac5                  # working tree vs ea66ac5
    .venv/bin/python benchmarks/ab.py --base main~3 --candidate main  # two refs
    .venv/bin/python benchmarks/ab.py --base HEAD --rounds 5 --concurrency 64 --itl-ms 0
    .venv/bin/python benchmarks/ab.py --base /tmp/base --workers 4      # an exported tree

A folder given as a ref is used as it is: on a machine without the repository's history (the GPU
host), export the base with `git archive REF | tar -x -C DIR` and carry it there.

Run it before and after changing the request path (serving/, triton/, the CPU engine): on a
2-core machine a single run of either side minutes apart differs by more than most changes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_clients
from benchmarks.bench_procs import (
    ROOT,
    PackedModel,
    Processes,
    Service,
    own_cpu_s,
    write_result,
)
from benchmarks.bench_stats import TargetSummary, format_number, summarize
from benchmarks.bench_workload import add_reference_texts, build_prompts
from tensorrtllm_backend.triton.command import find_free_port

REFERENCES = ("grpc_ensemble", "grpc_direct")
SERVICE_APIS = ("native", "openai")


def target_name(side: str, api: str) -> str:
    """A side's target for one API: the side's name for the native API (as before there were
    several), `side/api` for the others."""
    return side if api == "native" else f"{side}/{api}"


@dataclass
class Side:
    """One code version under test: its checkout, its model store and its running service."""

    name: str  # "base" | "candidate"
    ref: str  # what was checked out ("working tree" for the candidate by default)
    root: Path
    processes: Processes
    model: PackedModel | None = None
    service: Service | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra environment of its service

    def process_tree_cpu_s(self) -> tuple[float, float]:
        """CPU seconds so far of (the BentoML processes, tritonserver with its stubs)."""
        assert self.service is not None
        serving = self.service.serving_cpu_s()
        total = 0.0
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.service.process.pid)
            for process in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = process.cpu_times()
                    total += times.user + times.system
        return serving, total - serving


@dataclass
class Measured:
    """One target's figures in one round."""

    summary: TargetSummary
    serving_cpu_us: float | None = None  # per token, BentoML processes
    triton_cpu_us: float | None = None  # per token, tritonserver and its stubs
    # Per token, this process: the load generator. Its event loop also waits between a token's
    # arrival and its record, so a client that costs more per token inflates its TTFT.
    client_cpu_us: float | None = None


@dataclass
class Rounds:
    results: dict[str, list[Measured]] = field(default_factory=dict)
    # Per side, from its /metrics after the rounds: generations, and connections its workers
    # closed after an answer to spread their load (TRTLLM_REBALANCE_CONNECTIONS).
    released: dict[str, tuple[float, float]] = field(default_factory=dict)

    def add(self, target: str, measured: Measured) -> None:
        self.results.setdefault(target, []).append(measured)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="git ref (or folder) of the base side")
    parser.add_argument(
        "--candidate", help="git ref (or folder) of the candidate (default: the working tree)"
    )
    parser.add_argument("--workers", type=int, default=1, help="TRTLLM_WORKERS of both sides")
    parser.add_argument("--itl-ms", type=float, default=20.0, help="synthetic inter-token latency")
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--requests", type=int, default=256, help="per target and round")
    parser.add_argument("--max-tokens", type=int, default=100, help="output tokens per request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=16, help="unmeasured requests per target")
    parser.add_argument(
        "--workflow",
        choices=("engine", "llmapi"),
        default="engine",
        help="how both sides pack the synthetic engine: in the tensorrt_llm slot "
        "(route direct) or behind the llmapi model (route llmapi)",
    )
    parser.add_argument(
        "--base-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable of the base side's service (repeatable)",
    )
    parser.add_argument(
        "--candidate-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable of the candidate's service (repeatable)",
    )
    parser.add_argument(
        "--apis",
        default="native",
        help="the service's streaming APIs measured on each side, comma-separated: native "
        "(/generate), openai (/v1/completions); each is a target of its own",
    )
    parser.add_argument("--json", type=Path, help="result file (default benchmarks/results/...)")
    args = parser.parse_args(argv)
    args.apis = [api.strip() for api in args.apis.split(",") if api.strip()]
    unknown = set(args.apis) - set(SERVICE_APIS)
    if unknown or not args.apis:
        parser.error(f"--apis: choose among {', '.join(SERVICE_APIS)}")
    for name in ("base_env", "candidate_env"):
        pairs = [item.partition("=") for item in getattr(args, name)]
        if any(not key or not sep for key, sep, _ in pairs):
            parser.error(f"--{name.replace('_', '-')} takes KEY=VALUE")
        setattr(args, name, {key: value for key, _, value in pairs})
    return args


@contextlib.contextmanager
def checkout(ref: str, parent: Path) -> Iterator[Path]:
    """A detached worktree of `ref` under `parent`, removed afterwards; a folder as it is."""
    if Path(ref).is_dir():
        yield Path(ref).resolve()
        return
    path = parent / f"wt-{ref.replace('/', '_').replace('~', '-')}"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "--force", str(path), ref],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, capture_output=True
        )


def pack(side: Side, args: argparse.Namespace, workflow: str = "engine") -> PackedModel:
    """The synthetic model, packed by this side's own pack_model.py (the engine workflow is
    its default, and versions older than --workflow know no other)."""
    processes = side.processes
    pack_args = (
        "--synthetic", "--itl-ms", str(args.itl_ms), "--max-batch-size", str(args.concurrency),
        "--max-seq-len", str(max(2048, args.max_tokens + 1100)),
    )  # fmt: skip
    if workflow != "engine":
        pack_args = (*pack_args, "--workflow", workflow)
    return processes.pack(*pack_args, name=f"ab-{side.name}", root=side.root)


def start_service(side: Side, workers: int) -> Service:
    assert side.model is not None
    env = {
        "TRTLLM_WORKERS": str(workers),
        **side.env,
        "TRTLLM_MODEL": side.model.tag,
        "TRTLLM_TRITON_GRPC_PORT": str(find_free_port()),
    }
    service = side.processes.start_service(f"ab-{side.name}", "service:TRTLLM", side.root, env)
    side.processes.wait_workers(service, int(env["TRTLLM_WORKERS"]))
    service.triton_grpc_url = f"127.0.0.1:{env['TRTLLM_TRITON_GRPC_PORT']}"
    return service


async def measure(
    request: bench_clients.RequestFn,
    prompts: Sequence[bench_clients.PromptCase],
    args: argparse.Namespace,
    target: str,
    side: Side | None,
) -> Measured:
    await bench_clients.run_load(request, prompts, args.warmup, min(args.warmup, args.concurrency))
    before = side.process_tree_cpu_s() if side else None
    client_before = own_cpu_s()
    records, wall = await bench_clients.run_load(request, prompts, args.requests, args.concurrency)
    client_s = own_cpu_s() - client_before
    summary = summarize(target, "ab", args.concurrency, records, wall)
    measured = Measured(summary)
    if summary.output_tokens:
        measured.client_cpu_us = client_s * 1e6 / summary.output_tokens
    if side is not None and before is not None and summary.output_tokens:
        after = side.process_tree_cpu_s()
        tokens = summary.output_tokens
        measured.serving_cpu_us = (after[0] - before[0]) * 1e6 / tokens
        measured.triton_cpu_us = (after[1] - before[1]) * 1e6 / tokens
    return measured


def spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} ({min(values):.3f}..{max(values):.3f})"


def ratios(rounds: Rounds, target: str, reference: str) -> tuple[list[float], list[float]]:
    """Per round: tokens/s ratio and TTFT p50 difference (ms) of `target` against `reference`."""
    rate, ttft = [], []
    for mine, theirs in zip(rounds.results[target], rounds.results[reference], strict=True):
        a, b = mine.summary, theirs.summary
        if a.tokens_per_s and b.tokens_per_s:
            rate.append(a.tokens_per_s / b.tokens_per_s)
        if a.ttft_ms.p50 is not None and b.ttft_ms.p50 is not None:
            ttft.append(a.ttft_ms.p50 - b.ttft_ms.p50)
    return rate, ttft


async def released_connections(http: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """(generations, connections released) as a service's /metrics reports them."""
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    totals = {"trtllm_requests_total": 0.0, "trtllm_connections_released_total": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals["trtllm_requests_total"], totals["trtllm_connections_released_total"]


def report(rounds: Rounds, sides: Sequence[Side]) -> str:
    lines = [
        "per round: tok/s  TTFT p50 ms  serving CPU us/tok  triton CPU us/tok  "
        "client CPU us/tok  err/short"
    ]
    for target, results in rounds.results.items():
        for index, m in enumerate(results):
            s = m.summary
            lines.append(
                f"  {target:<16} r{index + 1}  {s.tokens_per_s:8.0f}  "
                f"{format_number(s.ttft_ms.p50):>8}  {format_number(m.serving_cpu_us, 0):>6}  "
                f"{format_number(m.triton_cpu_us, 0):>6}  {format_number(m.client_cpu_us, 0):>6}  "
                f"{s.errors}/{s.short + s.mismatched}"
            )
    lines.append("")
    lines.append(
        "pair                                 tok/s ratio median (min..max)   TTFT p50 delta ms"
    )
    apis = sorted({target.partition("/")[2] or "native" for target in rounds.results})
    pairs = []
    for api in apis:
        names = [target_name(side.name, api) for side in sides]
        pairs += [(target_name("candidate", api), target_name("base", api))]
        pairs += [(n, ref) for n in names for ref in REFERENCES]
    for target, reference in pairs:
        if target not in rounds.results or reference not in rounds.results:
            continue
        rate, ttft = ratios(rounds, target, reference)
        deltas = (
            f"{statistics.median(ttft):+.1f} ({min(ttft):+.1f}..{max(ttft):+.1f})" if ttft else "-"
        )
        lines.append(f"  {target + ' / ' + reference:<35}{spread(rate):<32}{deltas}")
    for side in sides:
        env = " ".join(f"{key}={value}" for key, value in side.env.items())
        lines.append(f"{side.name}: {side.ref}" + (f" ({env})" if env else ""))
        if side.name in rounds.released:
            generations, released = rounds.released[side.name]
            lines.append(
                f"  {released:.0f} of {generations:.0f} generations closed their connection "
                "to spread the load over the workers"
            )
    return "\n".join(lines)


async def run(args: argparse.Namespace, sides: list[Side], reference: Side) -> Rounds:
    assert reference.model is not None
    triton = reference.processes.start_triton(reference.model, "reference")
    prompts = build_prompts(reference.model.root, args.max_tokens)
    prompts = await add_reference_texts(triton.grpc_url, prompts, ["ensemble"], args.max_tokens)
    rounds = Rounds()
    direct = bench_clients.GrpcDirect(triton.grpc_url, args.max_tokens, pad_id=2)
    ensemble = bench_clients.GrpcEnsemble(triton.grpc_url, args.max_tokens)
    http = bench_clients.http_client(args.concurrency)
    targets: list[tuple[str, bench_clients.RequestFn, Side | None]] = [
        ("grpc_ensemble", ensemble, None),
        ("grpc_direct", direct, None),
    ]
    for side in sides:
        assert side.service is not None and side.model is not None
        model = side.model.tag.split(":")[0]
        for api in args.apis:
            request = bench_clients.service_request(
                api, http, side.service.url, model, args.max_tokens
            )
            targets.append((target_name(side.name, api), request, side))
    try:
        for index in range(args.rounds):
            order = targets if index % 2 == 0 else list(reversed(targets))
            for target, request, side in order:
                measured = await measure(request, prompts, args, target, side)
                rounds.add(target, measured)
                s = measured.summary
                print(
                    f"round {index + 1} {target:<16} {s.tokens_per_s:7.0f} tok/s  "
                    f"TTFT p50 {format_number(s.ttft_ms.p50)} ms  errors {s.errors}",
                    flush=True,
                )
        for side in sides:
            assert side.service is not None
            try:
                rounds.released[side.name] = await released_connections(http, side.service.url)
            except (aiohttp.ClientError, OSError) as error:  # the rounds' figures still count
                print(f"{side.name}: no /metrics ({error})", flush=True)
    finally:
        await http.close()
        await direct.close()
        await ensemble.close()
    return rounds


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trtllm-ab-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        base_root = stack.enter_context(checkout(args.base, work))
        if args.candidate:
            candidate_root, candidate_ref = (
                stack.enter_context(checkout(args.candidate, work)),
                args.candidate,
            )
        else:
            candidate_root, candidate_ref = ROOT, "working tree"
        sides = [
            Side("base", args.base, base_root, stack.enter_context(Processes(work / "base"))),
            Side("candidate", candidate_ref, candidate_root,
                 stack.enter_context(Processes(work / "candidate"))),
        ]  # fmt: skip
        # The references run on this checkout's code, with an engine-workflow model (the whole
        # inflight_batcher_llm repository) this checkout packed.
        reference = Side("reference", "this checkout", ROOT, Processes(work / "reference"))
        stack.enter_context(reference.processes)
        reference.model = pack(reference, args)
        for side in sides:
            side.env = args.base_env if side.name == "base" else args.candidate_env
            side.model = pack(side, args, args.workflow)
            side.service = start_service(side, args.workers)
            print(
                f"{side.name} ({side.ref}) ready in {side.service.cold_start_s:.1f} s", flush=True
            )
        rounds = asyncio.run(run(args, sides, reference))
        text = report(rounds, sides)
        print("\n" + text)
        result = {
            "settings": vars(args) | {"json": str(args.json) if args.json else None},
            "sides": {side.name: side.ref for side in sides},
            "environments": {"base": args.base_env, "candidate": args.candidate_env},
            "rounds": {
                target: [
                    m.summary.as_dict()
                    | {
                        "serving_cpu_us": m.serving_cpu_us,
                        "triton_cpu_us": m.triton_cpu_us,
                        "client_cpu_us": m.client_cpu_us,
                    }
                    for m in results
                ]
                for target, results in rounds.results.items()
            },  # fmt: skip
            "released_connections": {
                name: {"generations": generations, "released": released}
                for name, (generations, released) in rounds.released.items()
            },
            "report": text,
            "duration_s": time.perf_counter() - started,
        }
        path = write_result(result, args.json, "ab")
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
