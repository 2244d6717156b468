#!/usr/bin/env python3
"""One whole measurement on a GPU host (many cores), written to one folder, with tables on stdout.

    python benchmarks/gpu_host.py --out DIR --phases engine,workers          # synthetic, ITL 5 ms
    python benchmarks/gpu_host.py --out DIR --phases cells,breakdown         # ITL 20 ms, C=128
    python benchmarks/gpu_host.py --out DIR --phases demo                    # 1B random Llama

Phases (results go to DIR/gpu_host.json after each one):
- engine: the synthetic engine alone (Triton gRPC, no service) at --itl-ms / --concurrency for each
  --instances count (TRTLLM_ENGINE_INSTANCES): how many responses a second the stand-in emits.
- workers: the service's /generate and /v1/completions at the same cell, for each --workers
  count, on --engine-instances engine instances: tokens/s, TTFT p50/p99, CPU of the service
  (BentoML processes), of tritonserver with its stubs, and of the load generator.
- cells: stream_bench.py --cells 20:128,5:512 (--cells) --targets grpc_direct,native,openai
  (--cells-targets) --routes direct (--cells-routes) --rounds 2 for each --cells-workers count (its
  JSON is folded in).
- breakdown: ttft_breakdown.py at ITL 20 ms, C=128 on this machine.
- demo: pack_model --demo --demo-size 1b (random weights, hf mode: transformers on CUDA when a
  GPU is present, the project's stand-in, not TensorRT-LLM); Triton gRPC directly vs the
  service's /v1/completions at --demo-concurrency.
The load comes from --clients processes (benchmarks/multi_load.py): one Python client reads at
most ~8k responses a second.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_clients import PromptCase
from benchmarks.bench_procs import ROOT, PackedModel, Processes, Service, _is_triton
from benchmarks.bench_stats import TargetSummary, format_number
from benchmarks.multi_load import LoadSpec, run_multi
from benchmarks.stream_bench import openai_model_name, spawn_trtllm

ENGINE_INSTANCES_ENV = "TRTLLM_ENGINE_INSTANCES"

PHASES = ("engine", "workers", "cells", "breakdown", "demo")
DEMO_PROMPT = "Request {}: write a long story about a lighthouse keeper and the sea."


def _ints(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item.strip()]


def _worker_counts(text: str) -> list[str]:
    """Worker counts for stream_bench's --workers: numbers, or 'default' (the service's rule)."""
    counts = [item.strip() for item in text.split(",") if item.strip()]
    for count in counts:
        if count != "default":
            int(count)  # argparse reports the ValueError
    return counts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--out", type=Path, required=True, help="output folder (gpu_host.json)")
    add("--phases", default="engine,workers", help=f"subset of {','.join(PHASES)}")
    add("--itl-ms", type=float, default=5.0, help="engine/workers: synthetic ITL")
    add("--concurrency", type=int, default=512, help="engine/workers: streams in flight")
    add("--requests", type=int, default=2048, help="engine/workers: requests per measurement")
    add("--max-tokens", type=int, default=100, help="output tokens per request")
    add("--instances", type=_ints, default=[1, 2, 4, 8], help="engine: instance counts")
    add("--engine-instances", type=int, default=8, help="workers/cells: engine instances")
    add("--workers", type=_ints, default=[1, 2, 4, 8], help="workers: service worker counts")
    add("--clients", type=int, default=4, help="load generator processes")
    add("--cells", default="20:128,5:512", help="cells: stream_bench.py --cells")
    add("--cells-workers", type=_worker_counts, default=["1", "4"],
        help="cells: service worker counts ('default': TRTLLM_WORKERS unset)")  # fmt: skip
    add("--cells-requests", type=int, default=512, help="cells: requests per target")
    add(
        "--cells-targets",
        default="grpc_direct,native,openai",
        help="cells: stream_bench.py --targets",
    )
    add("--cells-routes", default="direct", help="cells: stream_bench.py --routes")
    add(
        "--cells-engine-stream-intervals",
        type=_ints,
        default=[1],
        help="cells: the synthetic engine's tokens per streamed response, one run each",
    )
    add("--demo-size", default="1b", help="demo: pack_model --demo-size")
    add("--demo-concurrency", type=int, default=64)
    add("--demo-requests", type=int, default=256)
    add("--demo-rounds", type=int, default=2, help="demo: alternating rounds of gRPC and OpenAI")
    return parser


# -- CPU clocks --------------------------------------------------------------------------------
def _tree_cpu(root: psutil.Process, keep: Callable[[psutil.Process, set[int]], bool]) -> float:
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    triton = {p.pid for p in processes if _is_triton(p)}
    total = 0.0
    for process in processes:
        try:
            if keep(process, triton):
                times = process.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


def _in_triton(process: psutil.Process, triton: set[int]) -> bool:
    return process.pid in triton or bool(triton & {a.pid for a in process.parents()})


def engine_stubs(root_pid: int) -> int:
    """Python stub processes under root_pid (one per model instance of the Python models)."""
    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        return 0
    count = 0
    for child in children:
        try:
            count += "triton_python_backend_stub" in child.name()
        except psutil.Error:
            continue
    return count


def triton_cpu_clock(root_pid: int) -> Callable[[], float]:
    """CPU seconds of every tritonserver under root_pid and its Python stubs."""
    return lambda: _tree_cpu(psutil.Process(root_pid), _in_triton)


# -- output ------------------------------------------------------------------------------------
def row(summary: TargetSummary, cpu: dict[str, float], **labels: Any) -> dict[str, Any]:
    tokens = max(summary.output_tokens, 1)
    per_10k = {f"{k}_cores_per_10k_tok_s": v / summary.wall_s * 1e4 / max(summary.tokens_per_s, 1)
               for k, v in cpu.items()}  # fmt: skip
    return {
        **labels,
        "target": summary.target,
        "tokens_per_s": round(summary.tokens_per_s, 1),
        "ttft_p50_ms": summary.ttft_ms.p50,
        "ttft_p99_ms": summary.ttft_ms.p99,
        "itl_p50_ms": summary.itl_ms.p50,
        "errors": summary.errors,
        "short": summary.short,
        "requests": summary.requests,
        "wall_s": round(summary.wall_s, 2),
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "cpu_us_per_token": {k: round(v / tokens * 1e6, 1) for k, v in cpu.items()},
        **{k: round(v, 3) for k, v in per_10k.items()},
        "first_error": summary.first_error,
    }


def print_rows(title: str, rows: list[dict[str, Any]], label: str) -> None:
    print(f"\n{title}")
    head = f"{label:>10} {'target':<14} {'tok/s':>8} {'TTFT p50':>9} {'p99':>8} {'ITL p50':>8}"
    print(head + "  CPU us/token (cores per 10k tok/s)                  errors")
    for r in rows:
        cpu = ", ".join(
            f"{k} {format_number(v, 0)} ({r.get(f'{k}_cores_per_10k_tok_s', 0):.2f})"
            for k, v in r["cpu_us_per_token"].items()
        )
        print(
            f"{r[label]!s:>10} {r['target']:<14} {r['tokens_per_s']:8.0f} "
            f"{format_number(r['ttft_p50_ms']):>9} {format_number(r['ttft_p99_ms']):>8} "
            f"{format_number(r['itl_p50_ms']):>8}  {cpu}  {r['errors']}+{r['short']}",
            flush=True,
        )


# -- phases ------------------------------------------------------------------------------------
def _prompts(model: PackedModel, max_tokens: int) -> tuple[list[PromptCase], int]:
    from benchmarks.bench_workload import build_prompts, engine_settings

    return build_prompts(model.root, max_tokens), int(engine_settings(model.root)["eos_token_id"])


def _pack(procs: Processes, args: argparse.Namespace) -> PackedModel:
    return procs.pack_synthetic(
        "gpu-host", itl_ms=args.itl_ms, max_batch_size=max(64, args.concurrency),
        max_tokens=args.max_tokens,
    )  # fmt: skip


def _cell(args: argparse.Namespace) -> str:
    return f"ITL {args.itl_ms:g} ms, C={args.concurrency}"


def phase_engine(args: argparse.Namespace, procs: Processes) -> list[dict[str, Any]]:
    model = _pack(procs, args)
    prompts, pad_id = _prompts(model, args.max_tokens)
    rows = []
    for count in args.instances:
        os.environ[ENGINE_INSTANCES_ENV] = str(count)
        supervisor = procs.start_triton(model, f"engine-x{count}")
        try:
            spec = LoadSpec("grpc", supervisor.grpc_url, args.max_tokens, pad_id)
            summary, cpu = run_multi(
                spec, prompts, requests=args.requests, concurrency=args.concurrency,
                processes=args.clients, name="grpc_direct", cell=_cell(args),
                cpu_clocks={"triton": triton_cpu_clock(os.getpid())},
            )  # fmt: skip
            rows.append(row(summary, cpu, instances=count, stubs=engine_stubs(os.getpid())))
            print_rows(f"engine alone, {_cell(args)}", rows[-1:], "instances")
        finally:
            procs.stop_triton(supervisor)
    return rows


def _service_clocks(service: Service) -> dict[str, Callable[[], float]]:
    return {"service": service.serving_cpu_s, "triton": triton_cpu_clock(service.process.pid)}


def phase_workers(args: argparse.Namespace, procs: Processes) -> list[dict[str, Any]]:
    model = _pack(procs, args)
    prompts, pad_id = _prompts(model, args.max_tokens)
    rows = []
    for workers in args.workers:
        env = {"TRTLLM_WORKERS": str(workers), ENGINE_INSTANCES_ENV: str(args.engine_instances)}
        service = spawn_trtllm(procs, model, "direct", name=f"w{workers}", env=env)
        try:
            procs.wait_ready(service)
            procs.wait_workers(service, workers)
            import asyncio

            name = asyncio.run(openai_model_name(service.url))
            for kind in ("grpc", "native", "openai"):
                url = service.triton_grpc_url if kind == "grpc" else service.url
                spec = LoadSpec(kind, str(url), args.max_tokens, pad_id, model=name)
                summary, cpu = run_multi(
                    spec, prompts, requests=args.requests, concurrency=args.concurrency,
                    processes=args.clients, name=kind if kind != "grpc" else "grpc_direct",
                    cell=_cell(args), cpu_clocks=_service_clocks(service),
                )  # fmt: skip
                rows.append(row(summary, cpu, workers=workers, instances=args.engine_instances,
                                stubs=engine_stubs(service.process.pid)))  # fmt: skip
                print_rows(f"service, {_cell(args)}", rows[-1:], "workers")
        finally:
            procs.stop_service(service)
    return rows


def _subprocess(argv: list[str], env: dict[str, str], timeout_s: float) -> int:
    print(f"-- {' '.join(argv)}", flush=True)
    return subprocess.call(
        [sys.executable, *argv], cwd=ROOT, env={**os.environ, **env}, timeout=timeout_s
    )


def phase_cells(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for interval in args.cells_engine_stream_intervals:
        for workers in args.cells_workers:
            key = f"workers={workers}" + (
                f",engine_stream_interval={interval}" if interval > 1 else ""
            )
            path = work / f"cells-w{workers}-si{interval}.json"
            code = _subprocess(
                ["benchmarks/stream_bench.py", "--cells", args.cells,
                 "--targets", args.cells_targets, "--routes", args.cells_routes,
                 "--requests", str(args.cells_requests),
                 "--rounds", "2", "--workers", workers, "--no-cold-start",
                 "--engine-stream-interval", str(interval), "--json", str(path)],
                {ENGINE_INSTANCES_ENV: str(args.engine_instances)}, 480,
            )  # fmt: skip
            results[key] = json.loads(path.read_text()) if path.is_file() else {"rc": code}
    return results


def phase_breakdown(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    path = work / "breakdown.json"
    code = _subprocess(
        ["benchmarks/ttft_breakdown.py", "--itl-ms", "20", "--concurrency", "128",
         "--requests", "512", "--rounds", "2", "--json", str(path)],
        {ENGINE_INSTANCES_ENV: str(args.engine_instances)}, 300,
    )  # fmt: skip
    return json.loads(path.read_text()) if path.is_file() else {"rc": code}


def phase_demo(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    import asyncio

    from tensorrtllm_backend.common.tokenization import load_tokenizer

    started = time.perf_counter()
    model = procs.pack(
        "--demo", "--demo-size", args.demo_size, "--device", "auto",
        "--max-batch-size", str(max(64, args.demo_concurrency)),
        "--max-input-len", "256", "--max-seq-len", "512", name=f"gpu-demo-{args.demo_size}",
    )  # fmt: skip
    pack_s = time.perf_counter() - started
    tokenizer = load_tokenizer(model.root / "tokenizer")
    prompts = []
    for index in range(16):
        text = DEMO_PROMPT.format(index)
        ids = tuple(tokenizer.encode(text, add_special_tokens=True))
        prompts.append(PromptCase(text, ids))
    service = spawn_trtllm(procs, model, "direct", name="demo")
    procs.wait_ready(service, timeout_s=400)
    name = asyncio.run(openai_model_name(service.url))
    rows = []

    def spec_of(kind: str) -> LoadSpec:
        url = service.triton_grpc_url if kind == "grpc" else service.url
        return LoadSpec(kind, str(url), args.max_tokens, int(tokenizer.eos_token_id),
                        model=name, expect=None)  # fmt: skip

    # Unmeasured, at full concurrency: the first batches of a fresh engine pay for CUDA's
    # kernel selection and the allocator's growth, which a first measured round would carry.
    run_multi(
        spec_of("grpc"), prompts, requests=2 * args.demo_concurrency,
        concurrency=args.demo_concurrency, processes=1, name="warm-up", cell="warm-up",
        cpu_clocks=_service_clocks(service),
    )  # fmt: skip
    for kind in ("grpc", "openai") * args.demo_rounds:  # alternating rounds
        spec = spec_of(kind)
        summary, cpu = run_multi(
            spec, prompts, requests=args.demo_requests, concurrency=args.demo_concurrency,
            processes=1, name=kind if kind != "grpc" else "grpc_direct",
            cell=f"demo {args.demo_size}, C={args.demo_concurrency}",
            cpu_clocks=_service_clocks(service),
        )  # fmt: skip
        rows.append(row(summary, cpu, model=f"demo-{args.demo_size}"))
        print_rows("demo model (hf stand-in)", rows[-1:], "model")
    device = "cuda" if _torch_cuda() else "cpu"  # what --device auto resolves to in the stub
    procs.stop_service(service)
    return {"pack_s": round(pack_s, 1), "device": device, "rows": rows}


def _torch_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        info["gpu"] = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["gpu"] = None
    return info


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        print(f"gpu_host: unknown phase(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_host.json"
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": " ".join(sys.argv),
        "machine": machine(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    work = Path(tempfile.mkdtemp(prefix="gpu-host-", dir=os.environ.get("TMPDIR")))
    failed = 0
    for phase in phases:
        started = time.perf_counter()
        print(f"\n== phase {phase}", flush=True)
        try:
            if phase in ("cells", "breakdown"):
                result[phase] = (phase_cells if phase == "cells" else phase_breakdown)(args, work)
            else:
                with Processes(work / phase) as procs:
                    runner = {"engine": phase_engine, "workers": phase_workers,
                              "demo": phase_demo}[phase]  # fmt: skip
                    result[phase] = runner(args, procs)
        except Exception as error:  # the other phases still run; the error is in the result
            failed += 1
            result[phase] = {"error": f"{type(error).__name__}: {error}"[:2000]}
            print(f"phase {phase} failed: {result[phase]['error']}", flush=True)
        result[f"{phase}_s"] = round(time.perf_counter() - started, 1)
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"\nwrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
