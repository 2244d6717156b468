#!/usr/bin/env python3
"""The hf stand-in alone: how its rate depends on how requests arrive, with no serving layer.

Runs the CPU engine's scheduler and hf backend in this process on the demo checkpoint (random
weights, `--demo-size`), with a closed loop of `--concurrency` slots, each sending its next
request the moment its last one ends. Two arrival patterns, in alternating rounds:
- `lockstep`: every slot starts at once. Requests of equal length then start and end together,
  so requests join the batch all in one step, once per `--max-tokens` steps (what a closed loop
  of direct gRPC calls does to the engine);
- `staggered`: slot i's first request is i/C of the full length, so requests end, and the next
  ones join, spread evenly over the steps (what traffic through a serving layer, or any real
  traffic, does).
An engine whose step costs the same whoever joins gives both the same rate; the gap between them
is what the arrival pattern alone costs the engine.

    .venv/bin/python benchmarks/hf_engine_bench.py                           # tiny, CPU, C=32
    python3 benchmarks/hf_engine_bench.py --demo-size 1b --device cuda --concurrency 64

Output: a table on stdout (rounded) and benchmarks/results/hf-engine-<time>.json (the figures
unrounded, as measured).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_procs import write_result

PROMPT = "Request {}: write a long story about a lighthouse keeper and the sea."
PATTERNS = ("lockstep", "staggered")


class _Loop:
    """A closed loop of `concurrency` slots over one scheduler. The rate is the tokens the engine
    produced between the C-th finished request (the first wave is over in both patterns) and the
    (C + requests)-th; then the slots stop and what is in flight runs out."""

    def __init__(self, scheduler: Any, prompts: list[list[int]], args: argparse.Namespace) -> None:
        self._scheduler = scheduler
        self._prompts = prompts
        self._args = args
        self._lock = threading.Lock()
        self._sent = self._finished = self._in_flight = 0
        self._marks: list[tuple[float, int]] = []  # (time, tokens generated) at start and end
        self._errors: list[str] = []
        self._measured = threading.Event()
        self._drained = threading.Event()

    def run(self, pattern: str) -> dict[str, Any]:
        concurrency, max_tokens = self._args.concurrency, self._args.max_tokens
        for slot in range(concurrency):
            length = max_tokens
            if pattern == "staggered":
                length = max(1, max_tokens * (slot + 1) // concurrency)
            self._send(length)
        for event in (self._measured, self._drained):
            if not event.wait(self._args.timeout_s):
                raise TimeoutError(f"{pattern}: no end within {self._args.timeout_s} s")
        if self._errors:
            raise RuntimeError(f"{pattern}: {self._errors[0]}")
        (t0, tokens0), (t1, tokens1) = self._marks
        tokens, wall_s = tokens1 - tokens0, t1 - t0
        # Unrounded: the ratio is computed from these; only the table rounds them.
        return {"pattern": pattern, "requests": self._args.requests, "tokens": tokens,
                "wall_s": wall_s, "tok_s": tokens / wall_s}  # fmt: skip

    def _send(self, length: int) -> None:
        from tensorrtllm_backend.python_models.cpu_engine.request import GenRequest

        with self._lock:
            self._sent += 1
            self._in_flight += 1
            prompt = self._prompts[self._sent % len(self._prompts)]
        self._scheduler.submit(
            GenRequest(
                prompt=prompt, max_new_tokens=length, sink=EndSink(self.ended_one), streaming=True
            )
        )

    def ended_one(self, req: Any, error: str | None) -> None:
        """A request ended (on the scheduler's thread): mark, then send the slot's next one."""
        args = self._args
        with self._lock:
            self._in_flight -= 1
            if error is not None:
                self._errors.append(error)
                self._measured.set()
            self._finished += 1
            if self._finished in (args.concurrency, args.concurrency + args.requests):
                self._marks.append((time.perf_counter(), self._scheduler.stats().generated_tokens))
                if len(self._marks) == 2:
                    self._measured.set()
            more = not self._measured.is_set()
            if not more and not self._in_flight:
                self._drained.set()
        if more:
            self._send(args.max_tokens)


class EndSink:
    """The scheduler's seam for one request, reduced to its end: `on_end(req, error)`, the
    error None when it finished. The tokens are counted by the scheduler's stats."""

    def __init__(self, on_end: Callable[[Any, str | None], None]) -> None:
        self._on_end = on_end

    def send_tokens(self, req: Any, chunk: Any, final: bool) -> None:
        pass

    def finish(self, req: Any, reason: Any) -> None:
        self._on_end(req, None)

    def fail(self, req: Any, message: str) -> None:
        self._on_end(req, message)

    def is_cancelled(self) -> bool:
        return False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-size", default="tiny", help="demo checkpoint shape: tiny or 1b")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=256, help="per round, warm-up aside")
    parser.add_argument("--max-tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each pattern, alternating")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--json", type=Path, help="where to write the result (default: results/)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.time()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tensorrtllm_backend.common.tokenization import load_tokenizer
    from tensorrtllm_backend.packing.demo import build_demo_checkpoint
    from tensorrtllm_backend.python_models.cpu_engine.hf import HFBackend
    from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler

    with tempfile.TemporaryDirectory(prefix="hf-engine-bench-") as tmp:
        checkpoint = build_demo_checkpoint(Path(tmp) / "checkpoint", args.demo_size)
        tokenizer = load_tokenizer(checkpoint)
        backend = HFBackend(checkpoint, device=args.device)
        prompts = [tokenizer.encode(PROMPT.format(i), add_special_tokens=True) for i in range(16)]
        scheduler = Scheduler(backend, max_batch_size=args.concurrency)
        scheduler.start()
        try:
            # Unmeasured: the first batches pay for kernel selection and the allocator's growth.
            _Loop(scheduler, prompts, args).run("lockstep")
            rows = [
                _Loop(scheduler, prompts, args).run(pattern)
                for _ in range(args.rounds)
                for pattern in PATTERNS
            ]
        finally:
            scheduler.stop()
    device_name = str(backend.device)
    if backend.device.type == "cuda":
        import torch

        device_name = f"cuda: {torch.cuda.get_device_name(backend.device)}"
    print(f"hf stand-in, demo {args.demo_size} on {backend.device}, C={args.concurrency}, "
          f"{args.max_tokens} tokens per request")  # fmt: skip
    print(f"{'pattern':<10} {'round':>5} {'requests':>8} {'tok/s':>9}")
    for index, row in enumerate(rows):
        print(f"{row['pattern']:<10} {index // 2 + 1:>5} {row['requests']:>8} {row['tok_s']:>9.1f}")
    rates = {p: [r["tok_s"] for r in rows if r["pattern"] == p] for p in PATTERNS}
    ratio = statistics.median(rates["staggered"]) / statistics.median(rates["lockstep"])
    print(f"staggered / lockstep, medians: {ratio:.3f}")
    write_result(
        {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
         "command": " ".join(["benchmarks/hf_engine_bench.py", *(argv or sys.argv[1:])]),
         "args": {k: str(v) for k, v in vars(args).items()}, "device": device_name,
         "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
         "rows": rows, "staggered_over_lockstep": ratio},
        args.json,
        "hf-engine",
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
