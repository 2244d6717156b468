#!/usr/bin/env python3
"""Streaming benchmark: the same load against Triton directly, Triton's HTTP
generate_stream, our native and OpenAI streaming APIs, and a straightforward baseline proxy.

One run packs synthetic-engine models, starts everything it measures, measures one target at a
time and stops every process it started (also on Ctrl-C):

    .venv/bin/python benchmarks/stream_bench.py --quick            # < 3 min
    .venv/bin/python benchmarks/stream_bench.py                    # all cells, < 15 min
    .venv/bin/python benchmarks/stream_bench.py --routes direct,ensemble,bls
    .venv/bin/python benchmarks/stream_bench.py --routes direct,llmapi --targets native,openai
    .venv/bin/python benchmarks/stream_bench.py --url http://gpu-host:3000 --cells 0:1,0:64

Targets: grpc_direct (the floor: tensorrt_llm with token ids over gRPC), triton_generate_stream
(POST /v2/models/ensemble/generate_stream), native[route] (POST /generate), openai[route]
(POST /v1/completions stream=true), baseline_proxy (benchmarks/baseline_service.py). The llmapi
route serves the same synthetic engine through the llmapi model (pack_model.py --synthetic
--workflow llmapi), so its figures sit next to direct's with only the model between them.
A cell is ITL:CONCURRENCY; the ITL (and --ttft-ms) are the synthetic engine's delays, so each
distinct ITL is a separately packed model. Output: a table on stdout and a JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_clients import (
    GrpcDirect,
    OpenAICompletions,
    PromptCase,
    RequestFn,
    TextStream,
    TritonGenerateStream,
    http_client,
    run_load,
)
from benchmarks.bench_procs import (
    BENCH_DIR,
    ROOT,
    PackedModel,
    Processes,
    Service,
    own_cpu_s,
    write_result,
)
from benchmarks.bench_stats import (
    InterleavedRounds,
    TargetSummary,
    add_ratios,
    check_goals,
    format_goals,
    format_number,
    format_table,
    summarize,
)
from tensorrtllm_backend.settings import host_workers
from tensorrtllm_backend.triton.command import find_free_port

ALL_TARGETS = ("grpc_direct", "triton_generate_stream", "native", "openai", "baseline")
ROUTE_MODELS = {"ensemble": "ensemble", "bls": "tensorrt_llm_bls"}
ROUTES = ("direct", "ensemble", "bls", "llmapi")
TOKEN_ROUTES = ("direct", "llmapi")  # token ids out: the text is the synthetic tokens' decode
DEFAULT_CELLS = "0:1,0:64,20:32,20:128"
TARGET_ORDER = {"grpc_direct": 0, "triton_generate_stream": 1, "native": 2, "openai": 3,
                "baseline_proxy": 4}  # fmt: skip


@dataclass(frozen=True)
class Cell:
    itl_ms: float
    concurrency: int

    @property
    def label(self) -> str:
        return f"ITL {self.itl_ms:g} ms, C={self.concurrency}"


# The cells the streaming goals name (docs/performance.md, "Goals").
ZERO_ITL_CELL = Cell(0.0, 64)
HIGH_ITL_CELL = Cell(20.0, 128)


def parse_cells(text: str) -> list[Cell]:
    cells = []
    for item in text.split(","):
        itl, sep, concurrency = item.strip().partition(":")
        if not sep:
            raise argparse.ArgumentTypeError(f"cell {item!r}: expected ITL_MS:CONCURRENCY")
        try:
            cell = Cell(float(itl), int(concurrency))
        except ValueError:
            raise argparse.ArgumentTypeError(f"cell {item!r}: not numbers") from None
        if cell.itl_ms < 0 or cell.concurrency < 1:
            raise argparse.ArgumentTypeError(f"cell {item!r}: ITL >= 0 and concurrency >= 1")
        cells.append(cell)
    return cells


def requests_for(cell: Cell, quick: bool, override: int | None) -> int:
    """Enough requests for a steady state, bounded so a full run stays under 15 minutes."""
    if override is not None:
        return max(override, cell.concurrency)
    if quick:
        return max(cell.concurrency, 8)
    if cell.itl_ms == 0:
        return max(4 * cell.concurrency, 32)
    return max(2 * cell.concurrency, 64)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests (< 3 minutes)")
    parser.add_argument("--cells", type=parse_cells, default=parse_cells(DEFAULT_CELLS),
                        help=f"ITL_MS:CONCURRENCY,... (default {DEFAULT_CELLS})")  # fmt: skip
    parser.add_argument("--requests", type=int, help="requests per target and cell")
    parser.add_argument("--max-tokens", type=int, default=100, help="output tokens per request")
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="synthetic first-token delay")
    parser.add_argument("--targets", default=",".join(ALL_TARGETS),
                        help=f"subset of {','.join(ALL_TARGETS)}")  # fmt: skip
    parser.add_argument("--routes", default="direct",
                        help=f"service routes for native/openai: {','.join(ROUTES)}")  # fmt: skip
    parser.add_argument(
        "--max-batch-size",
        type=int,
        help="engine max_batch_size (default: the largest concurrency, >= 64)",
    )
    parser.add_argument("--warmup", type=int, help="unmeasured requests before each target")
    parser.add_argument(
        "--rounds",
        "--cpu-rounds",
        dest="rounds",
        type=int,
        help="alternating rounds of bare gRPC client / native against the service's own "
        "tritonserver, and of baseline / native at ITL 0 ms, C=64, which the goals comparing "
        "them use (default 3, 1 with --quick, 0: none)",
    )
    parser.add_argument(
        "--cold-start",
        action=argparse.BooleanOptionalAction,
        help="pack + serve the demo model alone for its cold start (default: yes, not in --quick)",
    )
    parser.add_argument("--workers", type=workers_arg, default=1,
                        help="HTTP workers of the service, sharing its tritonserver (TRTLLM_WORKERS); "
                        "'default' leaves it unset: the service's own rule for the host")  # fmt: skip
    parser.add_argument("--stream-interval", type=int, default=1,
                        help="pieces per streamed HTTP message after the first "
                        "(TRTLLM_STREAM_INTERVAL)")  # fmt: skip
    parser.add_argument("--engine-stream-interval", type=int, default=1,
                        help="tokens per streamed response of the synthetic engine after the "
                        "first (pack_model --fill stream_interval=N; llmapi: --llm-arg)")  # fmt: skip
    parser.add_argument("--url", help="measure a running deployment (native + openai only)")
    parser.add_argument("--model", help="--url: OpenAI model name (default: from /v1/models)")
    parser.add_argument(
        "--tokenizer-dir", type=Path, help="--url: count native tokens by re-encoding the text"
    )
    parser.add_argument("--json", type=Path, help="result file (default benchmarks/results/...)")
    parser.add_argument("--keep-work-dir", action="store_true", help="keep logs and the store")
    return parser


# -- measuring -------------------------------------------------------------------------------
@dataclass
class Run:
    args: argparse.Namespace
    summaries: list[TargetSummary] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    interleaved: list[InterleavedRounds] = field(default_factory=list)
    # client: the baseline proxy, service: our native stream (each on its own tritonserver)
    baseline_rounds: list[InterleavedRounds] = field(default_factory=list)


async def load_with_cpu(
    request: RequestFn, prompts: Sequence[PromptCase], n: int, cell: Cell, name: str,
    cpu_clock: Callable[[], float] | None,
) -> TargetSummary:  # fmt: skip
    """run_load, summarized, with the CPU seconds `cpu_clock` counted over it (None: not
    measured)."""
    before = cpu_clock() if cpu_clock is not None else None
    records, wall = await run_load(request, prompts, n, cell.concurrency)
    cpu_s = cpu_clock() - before if cpu_clock is not None and before is not None else None
    return summarize(name, cell.label, cell.concurrency, records, wall, cpu_s)


async def measure(
    run: Run,
    name: str,
    cell: Cell,
    request: RequestFn,
    prompts: Sequence[PromptCase],
    cpu_clock: Callable[[], float] | None = None,
) -> TargetSummary:
    """cpu_clock: CPU seconds used so far by the process(es) serving the target."""
    args = run.args
    n = requests_for(cell, args.quick, args.requests)
    warmup = (
        args.warmup if args.warmup is not None else min(cell.concurrency, 2 if args.quick else 8)
    )
    if warmup:
        await run_load(request, prompts, warmup, min(warmup, cell.concurrency))
    summary = await load_with_cpu(request, prompts, n, cell, name, cpu_clock)
    run.summaries.append(summary)
    print(
        f"  {cell.label:<22} {name:<24} {summary.tokens_per_s:8.0f} tok/s  "
        f"TTFT p50 {summary.ttft_ms.p50 or 0:7.1f} ms  "
        f"CPU {format_number(summary.cpu_us_per_token, 0):>5} us/tok  errors {summary.errors}  "
        f"short {summary.short}",
        flush=True,
    )
    return summary


async def measure_triton(
    run: Run, cells: Sequence[Cell], grpc_url: str, http_url: str, prompts: Sequence[PromptCase],
    pad_id: int, targets: set[str],
) -> None:  # fmt: skip
    max_tokens = run.args.max_tokens
    for cell in cells:
        if "grpc_direct" in targets:
            direct = GrpcDirect(grpc_url, max_tokens, pad_id)
            try:
                await measure(run, "grpc_direct", cell, direct, prompts, own_cpu_s)
            finally:
                await direct.close()
        if "triton_generate_stream" in targets:
            async with http_client(cell.concurrency) as client:
                stream = TritonGenerateStream(client, http_url, max_tokens)
                await measure(run, "triton_generate_stream", cell, stream, prompts)


async def measure_http(
    run: Run, cells: Sequence[Cell], service: Service, prompts: Sequence[PromptCase],
    targets: set[str], label: str, expect: str | None, model: str | None, native: bool = True,
) -> None:  # fmt: skip
    """Native (or baseline) text streaming and OpenAI streaming against one service."""
    max_tokens = run.args.max_tokens
    url = service.url
    cpu = service.serving_cpu_s
    for cell in cells:
        async with http_client(cell.concurrency) as client:
            if native and "native" in targets:
                text = TextStream(client, f"{url}/generate", max_tokens, expect)
                await measure(run, f"native[{label}]", cell, text, prompts, cpu)
            if not native:
                text = TextStream(client, f"{url}/generate", max_tokens, expect, native=False)
                await measure(run, label, cell, text, prompts, cpu)
            if native and "openai" in targets and model is not None:
                openai = OpenAICompletions(client, url, model, max_tokens, expect)
                await measure(run, f"openai[{label}]", cell, openai, prompts, cpu)


async def _round(
    request: RequestFn, prompts: Sequence[PromptCase], n: int, cell: Cell, name: str,
    cpu_clock: Callable[[], float],
) -> TargetSummary:  # fmt: skip
    summary = await load_with_cpu(request, prompts, n, cell, name, cpu_clock)
    if summary.errors or summary.cpu_us_per_token is None:
        raise RuntimeError(
            f"{name}: no CPU figure ({summary.errors} requests failed, "
            f"{summary.output_tokens} tokens): {summary.first_error}"
        )
    return summary


async def alternate(
    cell: Cell, prompts: Sequence[PromptCase], rounds: int, n: int,
    first: tuple[str, RequestFn, Callable[[], float]],
    second: tuple[str, RequestFn, Callable[[], float]],
) -> InterleavedRounds:  # fmt: skip
    """`rounds` rounds of `first` then `second`, each (name, request, CPU clock)."""
    paired = InterleavedRounds(cell.label)
    for _ in range(rounds):
        paired.client.append(await _round(first[1], prompts, n, cell, first[0], first[2]))
        paired.service.append(await _round(second[1], prompts, n, cell, second[0], second[2]))
    return paired


def print_rounds(paired: InterleavedRounds, what: str) -> None:
    def each(summaries: list[TargetSummary], value: Callable[[TargetSummary], float | None]) -> str:
        return "/".join(format_number(value(summary), 0) for summary in summaries)

    print(
        f"  {paired.cell:<22} {paired.rounds} interleaved rounds, {what}: "
        f"tok/s {each(paired.client, lambda s: s.tokens_per_s)} vs "
        f"{each(paired.service, lambda s: s.tokens_per_s)}, "
        f"TTFT p50 ms {each(paired.client, lambda s: s.ttft_ms.p50)} vs "
        f"{each(paired.service, lambda s: s.ttft_ms.p50)}, "
        f"CPU us/tok {each(paired.client, lambda s: s.cpu_us_per_token)} vs "
        f"{each(paired.service, lambda s: s.cpu_us_per_token)}; medians: "
        f"{format_number(paired.tokens_ratio_median, 3)}x tok/s, "
        f"TTFT +{format_number(paired.ttft_delta_median)} ms, "
        f"CPU +{format_number(paired.added_median, 0)} us/tok",
        flush=True,
    )


async def interleaved_rounds(
    run: Run, cell: Cell, service: Service, prompts: Sequence[PromptCase], pad_id: int,
    rounds: int,
) -> None:  # fmt: skip
    """A bare gRPC client and the native stream in alternating rounds against the same
    tritonserver (the service's), so that slow phases of a shared machine hit both alike: the
    service's cost over direct gRPC (tokens/s, TTFT, CPU per token) without the drift between
    two measurements minutes apart."""
    if service.triton_grpc_url is None:
        return
    n = requests_for(cell, False, run.args.requests)
    direct = GrpcDirect(service.triton_grpc_url, run.args.max_tokens, pad_id)
    try:
        async with http_client(cell.concurrency) as client:
            native = TextStream(client, f"{service.url}/generate", run.args.max_tokens, "decode")
            paired = await alternate(
                cell, prompts, rounds, n,
                ("grpc_direct", direct, own_cpu_s),
                ("native[direct]", native, service.serving_cpu_s),
            )  # fmt: skip
    finally:
        await direct.close()
    run.interleaved.append(paired)
    print_rounds(paired, "bare gRPC client vs native")


async def baseline_rounds(
    run: Run, cell: Cell, baseline: Service, service: Service, prompts: Sequence[PromptCase],
    rounds: int,
) -> None:  # fmt: skip
    """The baseline proxy and the native stream in alternating rounds, for the 2x goal: the
    same drift-free comparison as interleaved_rounds, each service on its own tritonserver."""
    n = requests_for(cell, False, run.args.requests)
    max_tokens = run.args.max_tokens
    async with http_client(cell.concurrency) as client:
        paired = await alternate(
            cell, prompts, rounds, n,
            ("baseline_proxy", TextStream(client, f"{baseline.url}/generate", max_tokens,
                                          "ensemble", native=False), baseline.serving_cpu_s),
            ("native[direct]", TextStream(client, f"{service.url}/generate", max_tokens,
                                          "decode"), service.serving_cpu_s),
        )  # fmt: skip
    run.baseline_rounds.append(paired)
    print_rounds(paired, "baseline proxy vs native")


async def openai_model_name(url: str) -> str:
    async with http_client(1) as client, client.get(f"{url}/v1/models") as response:
        response.raise_for_status()
        return str((await response.json())["data"][0]["id"])


def run_local(run: Run, procs: Processes) -> None:
    args = run.args
    targets = set(args.targets.split(","))
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    cells: list[Cell] = args.cells
    max_batch = args.max_batch_size or max(64, *(c.concurrency for c in cells))
    text_models = [ROUTE_MODELS[r] for r in routes if r in ROUTE_MODELS]
    if "baseline" in targets:
        text_models = sorted({*text_models, "ensemble"})
    from benchmarks.bench_workload import add_reference_texts, build_prompts, engine_settings

    by_itl: dict[float, list[Cell]] = {}
    for cell in cells:
        by_itl.setdefault(cell.itl_ms, []).append(cell)
    for itl, group in by_itl.items():
        print(f"-- synthetic engine: ttft {args.ttft_ms:g} ms, itl {itl:g} ms", flush=True)
        model = procs.pack_synthetic(
            "bench-synthetic", itl_ms=itl, max_batch_size=max_batch, max_tokens=args.max_tokens,
            ttft_ms=args.ttft_ms, stream_interval=args.engine_stream_interval,
        )  # fmt: skip
        run.timings[f"pack_model_synthetic_itl{itl:g}_s"] = model.pack_s
        print(f"   pack_model: {model.pack_s:.1f} s", flush=True)
        prompts = build_prompts(model.root, args.max_tokens)
        pad_id = engine_settings(model.root)["eos_token_id"]
        served = {route: model for route in routes}
        if "llmapi" in routes and targets & {"native", "openai"}:
            served["llmapi"] = procs.pack_synthetic(
                "bench-synthetic", itl_ms=itl, max_batch_size=max_batch,
                max_tokens=args.max_tokens, ttft_ms=args.ttft_ms, workflow="llmapi",
                stream_interval=args.engine_stream_interval,
            )  # fmt: skip
            run.timings[f"pack_model_synthetic_llmapi_itl{itl:g}_s"] = served["llmapi"].pack_s
        # Start what this group needs at once (2 cores: startups overlap, measurements never do);
        # the clean cold-start figure is the demo's, measured alone at the end.
        first_service = None
        if targets & {"native", "openai"}:
            first_service = spawn_trtllm(procs, served[routes[0]], routes[0], env=service_env(args))
        started = time.perf_counter()
        supervisor = procs.start_triton(model, f"itl{itl:g}")
        run.timings[f"tritonserver_start_itl{itl:g}_s"] = time.perf_counter() - started
        try:
            baseline = None
            if "baseline" in targets:
                baseline = procs.spawn_service(
                    "baseline", "baseline_service:Baseline", BENCH_DIR,
                    {"BASELINE_TRITON_GRPC_URL": supervisor.grpc_url},
                )  # fmt: skip
            if text_models:
                prompts = asyncio.run(
                    add_reference_texts(supervisor.grpc_url, prompts, text_models, args.max_tokens)
                )
            if baseline is not None:
                procs.wait_ready(baseline)
                run.timings[f"baseline_cold_start_itl{itl:g}_s"] = baseline.cold_start_s
            if first_service is not None:
                procs.wait_ready(first_service)
            asyncio.run(
                measure_triton(
                    run, group, supervisor.grpc_url, supervisor.http_url, prompts, pad_id, targets
                )  # fmt: skip
            )
            if baseline is not None:
                try:
                    asyncio.run(
                        measure_http(
                            run,
                            group,
                            baseline,
                            prompts,
                            targets,
                            "baseline_proxy",
                            "ensemble",
                            None,
                            native=False,
                        )  # fmt: skip
                    )
                    rounds = interleaved_round_count(args)
                    zero = [cell for cell in group if cell == ZERO_ITL_CELL]
                    if first_service is not None and routes[0] == "direct" and rounds and zero:
                        procs.wait_workers(first_service, service_workers(args))
                        asyncio.run(
                            baseline_rounds(run, zero[0], baseline, first_service, prompts, rounds)
                        )
                finally:
                    procs.stop_service(baseline)
        finally:
            procs.stop_triton(supervisor)
        if first_service is None:
            continue
        for route in routes:
            service = (
                first_service
                if route == routes[0]
                else spawn_trtllm(procs, served[route], route, env=service_env(args))
            )
            procs.wait_ready(service)
            procs.wait_workers(service, service_workers(args))
            if service is not first_service:
                # The first one started alongside the Triton measurements and is only polled
                # after them: its figure would be theirs, not a cold start.
                run.timings[f"service_cold_start_{route}_itl{itl:g}_s"] = service.cold_start_s
                print(f"   service[{route}] cold start: {service.cold_start_s:.1f} s", flush=True)
            try:
                name = asyncio.run(openai_model_name(service.url))
                expect = "decode" if route in TOKEN_ROUTES else ROUTE_MODELS[route]
                asyncio.run(
                    measure_http(run, group, service, prompts, targets, route, expect, name)
                )
                rounds = interleaved_round_count(args)
                if route == "direct" and rounds and {"grpc_direct", "native"} <= targets:
                    for cell in group:
                        asyncio.run(interleaved_rounds(run, cell, service, prompts, pad_id, rounds))
            finally:
                procs.stop_service(service)
    if args.cold_start if args.cold_start is not None else not args.quick:
        measure_demo_cold_start(run, procs)


def interleaved_round_count(args: argparse.Namespace) -> int:
    if args.rounds is not None:
        return max(0, int(args.rounds))
    return 1 if args.quick else 3


def workers_arg(text: str) -> int | None:
    """A worker count, or None for 'default' (TRTLLM_WORKERS left unset)."""
    return None if text == "default" else int(text)


def service_workers(args: argparse.Namespace) -> int:
    return host_workers() if args.workers is None else int(args.workers)


def service_env(args: argparse.Namespace) -> dict[str, str]:
    """The service's settings under test, as its environment: a default is left unset, so the
    service's own rule decides."""
    env = {"TRTLLM_STREAM_INTERVAL": str(args.stream_interval)}
    if args.workers is not None:
        env["TRTLLM_WORKERS"] = str(args.workers)
    return env


def service_settings(args: argparse.Namespace) -> dict[str, str]:
    """The service's settings under test, as the results record them."""
    workers = str(args.workers) if args.workers is not None else f"unset ({host_workers()})"
    return {"TRTLLM_WORKERS": workers, **service_env(args)}


def spawn_trtllm(
    procs: Processes,
    model: PackedModel,
    route: str,
    name: str = "trtllm",
    env: dict[str, str] | None = None,
) -> Service:
    """The service on a free port, its tritonserver's gRPC on a known one (for the interleaved
    rounds)."""
    grpc_port = find_free_port()
    service = procs.spawn_service(
        f"{name}-{route}", "service:TRTLLM", ROOT,
        {"TRTLLM_MODEL": model.tag, "TRTLLM_ROUTE": route,
         "TRTLLM_TRITON_GRPC_PORT": str(grpc_port), **(env or {})},
    )  # fmt: skip
    service.triton_grpc_url = f"127.0.0.1:{grpc_port}"
    return service


@dataclass(frozen=True)
class ServedSynthetic:
    """A synthetic-engine model served by the service (direct route), ready for requests."""

    service: Service
    grpc_url: str  # the service's own tritonserver
    prompts: list[PromptCase]
    pad_id: int


def serve_synthetic(
    procs: Processes, name: str, *, itl_ms: float, max_batch_size: int, max_tokens: int,
    service_name: str = "trtllm", env: dict[str, str] | None = None,
) -> ServedSynthetic:  # fmt: skip
    """Pack a synthetic model, start the service on it and wait until it is ready; with the
    run's prompts and the pad id its bare gRPC client needs."""
    from benchmarks.bench_workload import build_prompts, engine_settings

    model = procs.pack_synthetic(
        name, itl_ms=itl_ms, max_batch_size=max_batch_size, max_tokens=max_tokens
    )
    prompts = build_prompts(model.root, max_tokens)
    pad_id = int(engine_settings(model.root)["eos_token_id"])
    service = spawn_trtllm(procs, model, "direct", name=service_name, env=env)
    procs.wait_ready(service)
    assert service.triton_grpc_url is not None
    return ServedSynthetic(service, service.triton_grpc_url, prompts, pad_id)


def measure_demo_cold_start(run: Run, procs: Processes) -> None:
    """The demo path of the README: pack_model --demo, then bentoml serve until /readyz."""
    print("-- demo model: pack_model --demo and cold start", flush=True)
    model = procs.pack("--demo", "--max-input-len", "256", "--max-seq-len", "512",
                       name="bench-demo")  # fmt: skip
    run.timings["pack_model_demo_s"] = model.pack_s
    service = spawn_trtllm(procs, model, "direct", name="demo")
    procs.wait_ready(service)
    run.timings["demo_cold_start_s"] = service.cold_start_s
    procs.stop_service(service)
    print(f"   pack_model --demo {model.pack_s:.1f} s, cold start {service.cold_start_s:.1f} s")


def run_remote(run: Run) -> None:
    """--url: only the service's own APIs can be reached; completeness from counts."""
    args = run.args
    targets = set(args.targets.split(",")) & {"native", "openai"}
    url = args.url.rstrip("/")
    model = args.model or asyncio.run(openai_model_name(url))
    prompts = [PromptCase(f"Tell me a long story about the sea, number {i}.", ()) for i in range(8)]
    if args.tokenizer_dir is not None:
        run.notes.append("native tokens: the text re-encoded with --tokenizer-dir")
    else:
        run.notes.append("native tokens: counted as text chunks (no --tokenizer-dir)")
    asyncio.run(measure_remote(run, url, model, prompts, targets))


async def measure_remote(
    run: Run, url: str, model: str, prompts: Sequence[PromptCase], targets: set[str]
) -> None:
    count_tokens: Callable[[str], int] | None = None
    if run.args.tokenizer_dir is not None:
        from tensorrtllm_backend.common.tokenization import load_tokenizer

        tokenizer = load_tokenizer(run.args.tokenizer_dir)

        def count_tokens(text: str) -> int:
            return len(tokenizer.encode(text, add_special_tokens=False))

    for cell in run.args.cells:
        async with http_client(cell.concurrency) as client:
            if "native" in targets:
                text = TextStream(client, f"{url}/generate", run.args.max_tokens, None,
                                  count_tokens=count_tokens)  # fmt: skip
                await measure(run, "native[remote]", cell, text, prompts)
            if "openai" in targets:
                openai = OpenAICompletions(client, url, model, run.args.max_tokens, None)
                await measure(run, "openai[remote]", cell, openai, prompts)


# -- reporting -----------------------------------------------------------------------------
def ordered(summaries: Sequence[TargetSummary], cells: Sequence[Cell]) -> list[TargetSummary]:
    position = {cell.label: index for index, cell in enumerate(cells)}

    def key(s: TargetSummary) -> tuple[int, int, str]:
        base = s.target.split("[", 1)[0]
        return position.get(s.cell, 99), TARGET_ORDER.get(base, 9), s.target

    return sorted(summaries, key=key)


def report(run: Run, started: float) -> dict[str, Any]:
    args = run.args
    summaries = ordered(run.summaries, args.cells)
    add_ratios(summaries)
    print()
    print(format_table(summaries))
    goals = check_goals(
        summaries, "native[direct]", "openai[direct]", HIGH_ITL_CELL.label, ZERO_ITL_CELL.label,
        run.interleaved, run.baseline_rounds,
    )  # fmt: skip
    if goals and not args.url:
        changed = {k: v for k, v in service_settings(args).items() if v != "1"}
        settings = ", ".join(f"{k}={v}" for k, v in changed.items()) or "default settings"
        print(f"\nGoals (informational; the service with {settings}):")
        print(format_goals(goals))
    if run.timings:
        print("\nTimings: " + ", ".join(f"{k}={v:.1f}" for k, v in run.timings.items()))
    for note in run.notes:
        print(f"note: {note}")
    return {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },  # fmt: skip
        "settings": {
            "quick": args.quick,
            "max_tokens": args.max_tokens,
            "ttft_ms": args.ttft_ms,
            "cells": [c.label for c in args.cells],
            "routes": args.routes,
            "targets": args.targets,
            "url": args.url,
            "service": service_settings(args),
        },  # fmt: skip
        "results": [s.as_dict() for s in summaries],
        "interleaved_rounds": [rounds.as_dict() for rounds in run.interleaved],
        "baseline_rounds": [rounds.as_dict() for rounds in run.baseline_rounds],
        "goals": [
            {"name": g.name, "cell": g.cell, "passed": g.passed, "detail": g.detail} for g in goals
        ],
        "timings_s": run.timings,
        "notes": run.notes,
        "duration_s": time.perf_counter() - started,
    }


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unknown = set(args.targets.split(",")) - set(ALL_TARGETS)
    bad_routes = set(args.routes.split(",")) - set(ROUTES)
    if unknown or bad_routes:
        print(f"stream_bench: unknown targets {unknown or ''} routes {bad_routes or ''}",
              file=sys.stderr)  # fmt: skip
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)  # clean up on kill too
    run = Run(args)
    status = 0
    started = time.perf_counter()
    work_dir = Path(tempfile.mkdtemp(prefix="stream-bench-"))
    try:
        if args.url:
            run_remote(run)
        else:
            with Processes(work_dir) as procs:
                run_local(run, procs)
    except KeyboardInterrupt:
        print("\nstream_bench: interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    except Exception as error:  # report what was measured before the failure
        print(f"stream_bench: error: {type(error).__name__}: {error}", file=sys.stderr)
        run.notes.append(f"run aborted: {type(error).__name__}: {error}"[:2000])
        status = 1
    finally:
        if args.keep_work_dir:
            print(f"work dir kept: {work_dir}", file=sys.stderr)
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    result = report(run, started)
    path = write_result(result, args.json, "stream_bench")
    print(f"\nwrote {path} ({result['duration_s']:.0f} s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
