#!/usr/bin/env python3
"""Quantized checkpoints on the hf stand-in: weight memory, tokens/s and TTFT of the CPU
stand-in (transformers, on a CUDA GPU where one is present) serving ModelOpt checkpoints next to
the unquantized one. These are the stand-in's figures, NOT TensorRT-LLM's.

In one process: builds the demo checkpoint (`--demo-size`, random weights), quantizes it with
NVIDIA ModelOpt to each quantized `--formats` entry (packing/quantize.py, what `pack_model.py
--quantize` runs: calibration on the shipped text, then ModelOpt's unified checkpoint), loads
every checkpoint in the hf backend and drives each with the engine's own Scheduler: no Triton,
no service. The stand-in dequantizes a quantized checkpoint to bf16 (float32 on a CPU) at load
and fake-quantizes its layers' inputs as ModelOpt's model does (cpu_engine/dequantize.py), so
the format saves no memory and no time once loaded: its checkpoint is smaller on disk, and its
input quantization costs extra work per layer.

The load, for each `--concurrency` C: a closed loop of C slots, each sending its next request
the moment its last one ends, every request `--max-tokens` tokens (greedy, no end token). The
first wave is staggered (slot i asks for (i + 1)/C of the length), so requests join a running
batch one after another, as through a serving layer, and is not measured. Measured: the next
`--requests` (at least 2 C) requests to finish. tokens/s: the tokens the engine produced while
they ran over that time; TTFT: submitted to the scheduler -> the step that produced its first
token; ITL: (last token - first token) / (tokens - 1), per request; decode tok/s per stream:
1000 / ITL p50. Formats alternate within each round (reversed every other round); each loaded
model first runs one unmeasured cell at the largest C (kernel selection, allocator growth).
Memory: torch.cuda.memory_allocated() after the load less before it, and the checkpoint's
weight files on disk. ModelOpt's CUDA fake-quantization extensions are not compiled (its eager
PyTorch version runs) unless `--build-modelopt-kernels`. A format that fails to quantize, load
or run is left out and its error listed; `--deadline-s` stops starting cells in time for a
time-limited call.

    .venv/bin/python benchmarks/quantized_bench.py --demo-size awq          # CPU: the logic
    python3 benchmarks/quantized_bench.py --demo-size 1b --out OUT           # on a GPU

Output: two markdown tables on stdout and in OUT/quantized.md, the figures unrounded in
OUT/quantized.json (default OUT: benchmarks/results/quantized-<time>/), rewritten after every
cell so that a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.hf_engine_bench import EndSink

PROMPT = "Request {}: write a long story about a lighthouse keeper and the sea."
UNQUANTIZED = "none"
LABEL = "CPU stand-in (hf engine, transformers), NOT TensorRT-LLM"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class _Loop:
    """A closed loop of `concurrency` slots over one scheduler (module docstring: the load)."""

    def __init__(
        self, scheduler: Any, prompts: list[list[int]], concurrency: int, requests: int,
        max_tokens: int, timeout_s: float,
    ) -> None:  # fmt: skip
        self._scheduler = scheduler
        self._prompts = prompts
        self._concurrency, self._requests = concurrency, requests
        self._max_tokens, self._timeout_s = max_tokens, timeout_s
        self._lock = threading.Lock()
        self._sent = self._finished = self._in_flight = 0
        self._marks: list[tuple[float, int]] = []  # (time, engine's tokens) at start and end
        self._measured_reqs: list[Any] = []
        self._errors: list[str] = []
        self._done = threading.Event()
        self._drained = threading.Event()

    def run(self) -> dict[str, Any]:
        c, length = self._concurrency, self._max_tokens
        for slot in range(c):
            self._send(max(1, length * (slot + 1) // c))
        for event in (self._done, self._drained):
            if not event.wait(self._timeout_s):
                raise TimeoutError(f"C={c}: no end within {self._timeout_s} s")
        if self._errors:
            raise RuntimeError(f"C={c}: {self._errors[0]}")
        (t0, tokens0), (t1, tokens1) = self._marks
        ttft = [(r.first_token_ns - r.arrival_ns) / 1e6 for r in self._measured_reqs]
        itl = [
            (r.last_token_ns - r.first_token_ns) / 1e6 / (len(r.generated) - 1)
            for r in self._measured_reqs
            if len(r.generated) > 1
        ]
        short = sum(len(r.generated) != length for r in self._measured_reqs)
        if short:
            raise RuntimeError(f"C={c}: {short} measured requests ended short of {length} tokens")
        return {
            "concurrency": c,
            "requests": len(self._measured_reqs),
            "tokens": tokens1 - tokens0,
            "wall_s": t1 - t0,
            "tok_s": (tokens1 - tokens0) / (t1 - t0),
            "ttft_p50_ms": _percentile(ttft, 0.5),
            "ttft_p90_ms": _percentile(ttft, 0.9),
            "itl_p50_ms": statistics.median(itl) if itl else float("nan"),
        }

    def _send(self, length: int) -> None:
        from tensorrtllm_backend.python_models.cpu_engine.request import GenRequest

        with self._lock:
            prompt = self._prompts[self._sent % len(self._prompts)]
            self._sent += 1
            self._in_flight += 1
        self._scheduler.submit(
            GenRequest(
                prompt=prompt, max_new_tokens=length, sink=EndSink(self.ended), streaming=True
            )
        )

    def ended(self, req: Any, error: str | None) -> None:
        """A request ended (on the scheduler's thread): mark, then send the slot's next one."""
        with self._lock:
            self._in_flight -= 1
            if error is not None:
                self._errors.append(error)
                self._done.set()
            self._finished += 1
            if len(self._marks) == 1:
                self._measured_reqs.append(req)
            if self._finished in (self._concurrency, self._concurrency + self._requests):
                self._marks.append((time.perf_counter(), self._scheduler.stats().generated_tokens))
                if len(self._marks) == 2:
                    self._done.set()
            more = not self._done.is_set()
            if not more and not self._in_flight:
                self._drained.set()
        if more:
            self._send(self._max_tokens)


def _weights_on_disk(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.safetensors"))


def _skip_modelopt_kernel_builds() -> None:
    """ModelOpt compiles CUDA extensions for its fake quantization on first use (minutes, where
    a compiler is found at all); without them it runs its eager PyTorch version, the same
    arithmetic. Mark them as not built so that a time-limited run spends no time compiling."""
    from modelopt.torch.quantization import extensions

    for name in ("get_cuda_ext", "get_cuda_ext_fp8", "get_cuda_ext_mx"):
        getattr(extensions, name).extension = None


def _release_gpu() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def prepare(args: argparse.Namespace, work: Path, errors: list[str]) -> dict[str, dict[str, Any]]:
    """The demo checkpoint and its quantized exports: by format, its directory and facts (a
    format whose quantization failed is left out, its error added to `errors`)."""
    from tensorrtllm_backend.common.quantization import from_checkpoint
    from tensorrtllm_backend.packing.demo import build_demo_checkpoint
    from tensorrtllm_backend.packing.quantize import quantize_checkpoint

    started = time.monotonic()
    base = build_demo_checkpoint(work / UNQUANTIZED, args.demo_size)
    print(f"demo {args.demo_size} built in {time.monotonic() - started:.1f} s", flush=True)
    _release_gpu()
    models = {UNQUANTIZED: {"dir": base, "quantize_s": None}}
    for fmt in args.formats:
        if fmt == UNQUANTIZED:
            continue
        started = time.monotonic()
        try:
            quantize_checkpoint(
                base, work / fmt, fmt, calib_size=args.calib_size, show_progress=False
            )
        except Exception as error:  # the other formats are still measured
            _failed(errors, f"quantize {fmt}", error)
            continue
        finally:
            _release_gpu()
        models[fmt] = {"dir": work / fmt, "quantize_s": time.monotonic() - started}
    for model in models.values():
        quantization = from_checkpoint(model["dir"])
        model["quantization"] = quantization.describe() if quantization else "none"
        model["checkpoint_bytes"] = _weights_on_disk(model["dir"])
    return {fmt: models[fmt] for fmt in args.formats if fmt in models}


def _failed(errors: list[str], what: str, error: BaseException) -> None:
    import traceback

    traceback.print_exception(error)
    errors.append(f"{what}: {type(error).__name__}: {error}")
    print(f"FAILED {what}: {error}", flush=True)


def load(models: dict[str, dict[str, Any]], device: str, errors: list[str]) -> dict[str, Any]:
    """Each model in the hf backend, one after another, with what its load took (one that
    fails to load is left out, its error added to `errors`)."""
    import torch

    from tensorrtllm_backend.python_models.cpu_engine.hf import HFBackend

    backends = {}
    for fmt, model in models.items():
        on_gpu = torch.cuda.is_available() and device != "cpu"
        if on_gpu:
            torch.cuda.synchronize()
        before = torch.cuda.memory_allocated() if on_gpu else 0
        started = time.monotonic()
        try:
            backend = HFBackend(model["dir"], device=device)
        except Exception as error:
            _failed(errors, f"load {fmt}", error)
            _release_gpu()
            continue
        if backend.device.type == "cuda":
            torch.cuda.synchronize()
            model["gpu_allocated_bytes"] = torch.cuda.memory_allocated() - before
        model["load_s"] = time.monotonic() - started
        tensors = [*backend.model.parameters(), *backend.model.buffers()]
        model["weights_bytes"] = sum(t.numel() * t.element_size() for t in tensors)
        model["dtype"] = str(next(backend.model.parameters()).dtype).removeprefix("torch.")
        backends[fmt] = backend
        print(f"{fmt}: loaded in {model['load_s']:.1f} s", flush=True)
    return backends


def measure(
    backend: Any, prompts: list[list[int]], concurrency: int, args: argparse.Namespace
) -> dict[str, Any]:
    from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler

    scheduler = Scheduler(backend, max_batch_size=concurrency)
    scheduler.start()
    try:
        requests = max(args.requests, 2 * concurrency)
        loop = _Loop(scheduler, prompts, concurrency, requests, args.max_tokens, args.timeout_s)
        return loop.run()
    finally:
        scheduler.stop()


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def tables(result: dict[str, Any]) -> str:
    """The result as markdown: the models, then the load figures (medians over rounds)."""
    models, cells = result["models"], result["cells"]
    on_gpu = any("gpu_allocated_bytes" in m for m in models.values())
    lines = [
        f"{LABEL}: demo {result['args']['demo_size']} on {result['device']}, {result['date']}",
        "",
        "| format | ModelOpt quantization | weights on disk | "
        + ("GPU memory after load | " if on_gpu else "")
        + "weights loaded as | quantize | load |",
        "|---|---|---|" + ("---|" if on_gpu else "") + "---|---|---|",
    ]
    for fmt, m in models.items():
        lines.append(
            f"| {fmt} | {m['quantization']} | {m['checkpoint_bytes'] / 2**20:,.1f} MiB | "
            + (f"{m.get('gpu_allocated_bytes', 0) / 2**20:,.1f} MiB | " if on_gpu else "")
            + f"{m['weights_bytes'] / 2**20:,.1f} MiB {m['dtype']} | "
            + (f"{m['quantize_s']:.1f} s" if m["quantize_s"] is not None else "—")
            + f" | {m['load_s']:.1f} s |"
        )
    rounds = max((row["round"] for row in cells), default=0)
    lines += [
        "",
        f"{result['args']['max_tokens']} tokens per request, greedy; median of {rounds} "
        "round(s), (min..max) over rounds.",
        "",
        "| format | C | tok/s | TTFT p50 | TTFT p90 | ITL p50 | decode tok/s per stream |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in result["args"]["concurrency"]:
        for fmt in models:
            rows = [r for r in cells if r["format"] == fmt and r["concurrency"] == c]
            if not rows:
                continue
            rates = [r["tok_s"] for r in rows]
            itl = _median(rows, "itl_p50_ms")
            lines.append(
                f"| {fmt} | {c} | {statistics.median(rates):,.1f} "
                f"({min(rates):,.0f}..{max(rates):,.0f}) | {_median(rows, 'ttft_p50_ms'):.1f} ms"
                f" | {_median(rows, 'ttft_p90_ms'):.1f} ms | {itl:.2f} ms | {1000 / itl:,.1f} |"
            )
    lines += ["", *(f"Error: {error}" for error in result.get("errors", []))]
    return "\n".join(lines).rstrip("\n") + "\n"


def _versions() -> dict[str, str]:
    import torch
    import transformers

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__}  # fmt: skip
    try:
        import modelopt

        versions["modelopt"] = modelopt.__version__
    except ImportError:
        pass
    return versions


def _save(result: dict[str, Any], out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    text = tables(result)
    (out / "quantized.md").write_text(text, encoding="utf-8")
    (out / "quantized.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-size", default="awq", help="tiny (fp8 only), awq or 1b")
    parser.add_argument(
        "--formats", default=f"{UNQUANTIZED},fp8,int4_awq",
        help=f"comma-separated: {UNQUANTIZED} (the checkpoint as built) and --quantize formats",
    )  # fmt: skip
    parser.add_argument("--device", default="auto", help="where the stand-in runs: auto, cpu, cuda")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated C values")
    parser.add_argument("--requests", type=int, default=4, help="measured per cell, at least 2 C")
    parser.add_argument("--max-tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calib-size", type=int, default=None, help="default: quantize.py's")
    parser.add_argument(
        "--build-modelopt-kernels", action="store_true",
        help="let ModelOpt compile its CUDA fake-quantization extensions (minutes)",
    )  # fmt: skip
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per cell")
    parser.add_argument(
        "--deadline-s", type=float, default=0.0,
        help="start no cell this many seconds after the start (0: no limit); what ran is kept",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="folder for quantized.md and quantized.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    started = time.time()
    out = args.out or Path(__file__).resolve().parent / "results" / time.strftime(
        "quantized-%Y%m%d-%H%M%S", time.gmtime(started)
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from tensorrtllm_backend.common.tokenization import load_tokenizer

    if any(f != UNQUANTIZED for f in args.formats) and not args.build_modelopt_kernels:
        _skip_modelopt_kernel_builds()
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="quantized-bench-") as tmp:
        models = prepare(args, Path(tmp), errors)
        backends = load(models, args.device, errors)
        tokenizer = load_tokenizer(next(iter(models.values()))["dir"])
    if not backends:
        print("nothing loaded:", *errors, sep="\n  ")
        return 1
    prompts = [tokenizer.encode(PROMPT.format(i), add_special_tokens=True) for i in range(16)]
    device = next(iter(backends.values())).device
    device_name = str(device)
    if device.type == "cuda":
        device_name = f"cuda: {torch.cuda.get_device_name(device)}"
    result: dict[str, Any] = {
        "label": LABEL,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
        "command": " ".join(["benchmarks/quantized_bench.py", *(argv or sys.argv[1:])]),
        "args": {
            k: v if isinstance(v, list | int | float) else str(v) for k, v in vars(args).items()
        },
        "device": device_name,
        "machine": {"cpus": os.cpu_count(), **_versions()},
        "models": {f: {k: v for k, v in models[f].items() if k != "dir"} for f in backends},
        "cells": [],
        "errors": errors,
    }
    text = _save(result, out)
    top = max(args.concurrency)
    for fmt in list(backends):  # unmeasured: kernel selection, allocator growth
        try:
            measure(backends[fmt], prompts, top, args)
        except Exception as error:
            _failed(errors, f"warm-up {fmt}", error)
            del backends[fmt], result["models"][fmt]
    order = list(backends)
    cells = [
        (round_, c, fmt)
        for round_ in range(1, args.rounds + 1)
        for c in args.concurrency
        for fmt in (order if round_ % 2 else order[::-1])
    ]
    for index, (round_, c, fmt) in enumerate(cells):
        if args.deadline_s and time.time() - started > args.deadline_s:
            errors.append(f"deadline: {len(cells) - index} cells not run, from round {round_}")
            break
        try:
            row = measure(backends[fmt], prompts, c, args)
        except Exception as error:
            _failed(errors, f"round {round_} {fmt} C={c}", error)
            continue
        result["cells"].append({"round": round_, "format": fmt, **row})
        print(f"round {round_} {fmt} C={c}: {row['tok_s']:.1f} tok/s, TTFT p50 "
              f"{row['ttft_p50_ms']:.1f} ms", flush=True)  # fmt: skip
        text = _save(result, out)
    text = _save(result, out)
    print()
    print(text, end="")
    print(f"written: {out / 'quantized.md'}, {out / 'quantized.json'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
