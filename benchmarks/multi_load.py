"""A load generator spread over several processes.

One Python process reads at most ~7-9k streamed responses a second (each costs it 110-150 µs of
CPU), so a single client cannot measure a service that streams tens of thousands of tokens a
second: it would measure itself. Here P processes each run `run_load` with C/P of the streams and
N/P of the requests; they warm up, meet at a barrier and start together. Their records (taken on
the system-wide monotonic clock) are merged into one summary, with the CPU the clients used.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .bench_clients import (
    GrpcDirect,
    PromptCase,
    RequestFn,
    http_client,
    run_load,
    service_request,
)
from .bench_stats import RequestRecord, TargetSummary, summarize

RESULT_TIMEOUT_S = 420.0


@dataclass(frozen=True)
class LoadSpec:
    """What every client process sends: target kind, where, and how many."""

    kind: str  # grpc | native | openai
    url: str  # gRPC host:port, or the service's base URL
    max_tokens: int
    pad_id: int = 2
    model: str | None = None  # openai: the model name
    expect: str | None = "decode"  # which PromptCase.expected text a complete answer equals
    warmup: int = 4


async def _client_load(
    spec: LoadSpec, prompts: Sequence[PromptCase], n: int, concurrency: int, barrier: Any
) -> tuple[list[RequestRecord], float]:
    """This process's share: warm up, wait for the others, then the measured requests (with the
    CPU this process spent on them)."""

    async def go(request: RequestFn) -> tuple[list[RequestRecord], float]:
        if spec.warmup:
            await run_load(request, prompts, spec.warmup, min(spec.warmup, concurrency))
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
        cpu_before = time.process_time()
        records, _ = await run_load(request, prompts, n, concurrency)
        return records, time.process_time() - cpu_before

    if spec.kind == "grpc":
        direct = GrpcDirect(spec.url, spec.max_tokens, spec.pad_id)
        try:
            return await go(direct)
        finally:
            await direct.close()
    async with http_client(concurrency) as client:
        model = spec.model or "model"
        request = service_request(spec.kind, client, spec.url, model, spec.max_tokens, spec.expect)
        return await go(request)


def _client_main(
    spec: LoadSpec, prompts: list[PromptCase], n: int, concurrency: int, barrier: Any, out: Any
) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        out.put(("ok", asyncio.run(_client_load(spec, prompts, n, concurrency, barrier))))
    except BaseException as error:  # reported to the parent, which fails the measurement
        barrier.abort()
        out.put(("error", f"{type(error).__name__}: {error}"))


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_multi(
    spec: LoadSpec,
    prompts: Sequence[PromptCase],
    *,
    requests: int,
    concurrency: int,
    processes: int,
    name: str,
    cell: str,
    cpu_clocks: dict[str, Callable[[], float]] | None = None,
) -> tuple[TargetSummary, dict[str, float]]:
    """`requests` requests at `concurrency` from `processes` client processes.

    Returns the merged summary and CPU seconds over the measured window: each clock of
    `cpu_clocks` (e.g. the service, tritonserver) and the clients' own ("clients").
    """
    processes = max(1, min(processes, concurrency))
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(processes + 1)
    out = ctx.Queue()
    children = [
        ctx.Process(
            target=_client_main,
            args=(spec, list(prompts), n, c, barrier, out),
            daemon=True,
        )
        for n, c in zip(_split(requests, processes), _split(concurrency, processes), strict=True)
    ]
    for child in children:
        child.start()
    try:
        barrier.wait(timeout=RESULT_TIMEOUT_S)
        clocks = cpu_clocks or {}
        before = {key: clock() for key, clock in clocks.items()}
        results = []
        for _ in children:
            status, value = out.get(timeout=RESULT_TIMEOUT_S)
            if status != "ok":
                raise RuntimeError(f"{name}: a client process failed: {value}")
            results.append(value)
        cpu = {key: clock() - before[key] for key, clock in clocks.items()}
    except (queue.Empty, mp.BrokenBarrierError) as error:
        raise RuntimeError(f"{name}: client processes did not finish ({error!r})") from error
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
    records = [record for part, _ in results for record in part]
    cpu["clients"] = sum(client_cpu for _, client_cpu in results)
    wall = max(r.end for r in records) - min(r.start for r in records)
    main = "service" if "service" in cpu else None
    summary = summarize(name, cell, concurrency, records, wall, cpu.get(main) if main else None)
    return summary, cpu
