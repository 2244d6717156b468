"""Benchmark-only time marks along the first token's path inside the service's worker.

`benchmarks/ttft_breakdown.py` starts `bentoml serve` with this folder on PYTHONPATH and
TTFT_PROBE_LOG set; Python then loads this module at start-up. Without TTFT_PROBE_LOG it does
nothing, and it never ships with the service. When the `service` module is first imported, it wraps:
- uvicorn's httptools protocol: headers parsed, ASGI task running, first body write, last write;
- the service's GuardMiddleware, the first middleware of ours (after BentoML's own);
- TritonLLMClient.stream: the Triton call, its first response, and the engine's own timestamps
  (`return_perf_metrics`, part of the tensorrt_llm contract), read from the final response.

One JSON line per request that carried an `x-probe-t0` header (the client's send time). Marks are
time.perf_counter() seconds: CLOCK_MONOTONIC, the same clock in every process of the machine.
The engine reports wall-clock nanoseconds; they are converted with the offset between the two
clocks taken at the call.
"""

from __future__ import annotations

import contextvars
import importlib.abc
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

LOG_ENV = "TTFT_PROBE_LOG"
T0_HEADER = b"x-probe-t0"
ENGINE_MARKS = {
    "arrival_time_ns": "engine_arrival",
    "first_scheduled_time_ns": "engine_scheduled",
    "first_token_time_ns": "engine_first_token",
}


def with_perf_metrics(
    tensors: Mapping[str, Any], outputs: Sequence[str]
) -> tuple[dict[str, Any], list[str]]:
    """A tensorrt_llm request that also asks for the engine's timestamps."""
    import numpy as np

    return (
        {**tensors, "return_perf_metrics": np.array([[True]], dtype=np.bool_)},
        [*outputs, *ENGINE_MARKS],
    )


def read_engine_marks(result: Any, offset_s: float, marks: dict[str, Any]) -> None:
    """The engine's timestamps in a response (the final one carries them) into `marks`, as
    perf_counter seconds; offset_s = time.time() - time.perf_counter()."""
    for output, mark in ENGINE_MARKS.items():
        value = result.values(output)
        if value:
            marks[mark] = int(value[0]) / 1e9 - offset_s


_marks: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "ttft_probe_marks", default=None
)


def _patch(log: Any) -> None:
    import uvicorn.protocols.http.httptools_impl as httptools_impl

    from tensorrtllm_backend.serving import guard
    from tensorrtllm_backend.triton import client as client_module

    protocol = httptools_impl.HttpToolsProtocol
    cycle_class = httptools_impl.RequestResponseCycle

    headers_complete = protocol.on_headers_complete

    def on_headers_complete(self: Any) -> None:
        now = time.perf_counter()
        headers_complete(self)
        t0 = dict(self.scope.get("headers") or []).get(T0_HEADER)
        if t0 is not None and self.cycle is not None:
            self.cycle.probe_marks = {"t0": t0.decode(), "headers": now}

    run_asgi = cycle_class.run_asgi

    async def run_asgi_marked(self: Any, app: Any) -> None:
        marks = getattr(self, "probe_marks", None)
        if marks is not None:
            marks["asgi"] = time.perf_counter()
            _marks.set(marks)
        await run_asgi(self, app)

    send = cycle_class.send

    async def send_marked(self: Any, message: Any) -> None:
        marks = getattr(self, "probe_marks", None)
        if marks is not None and message["type"] == "http.response.body":
            if message.get("body") and "first_body" not in marks:
                marks["first_body"] = time.perf_counter()
            if not message.get("more_body", False):
                log.write(json.dumps(marks) + "\n")
        await send(self, message)

    guard_call = guard.GuardMiddleware.__call__

    async def guard_marked(self: Any, scope: Any, receive: Any, send: Any) -> None:
        marks = _marks.get()
        if marks is not None and "middleware" not in marks:
            marks["middleware"] = time.perf_counter()
        await guard_call(self, scope, receive, send)

    stream = client_module.TritonLLMClient.stream

    async def stream_marked(
        self: Any, model_name: str, tensors: Any, outputs: Any, request_id: str
    ) -> Any:
        marks = _marks.get()
        if marks is None or model_name != "tensorrt_llm":
            async for result in stream(self, model_name, tensors, outputs, request_id):
                yield result
            return
        tensors, outputs = with_perf_metrics(tensors, outputs)
        marks["triton_call"] = time.perf_counter()
        offset_s = time.time() - time.perf_counter()
        async for result in stream(self, model_name, tensors, outputs, request_id):
            marks.setdefault("first_response", time.perf_counter())
            read_engine_marks(result, offset_s, marks)
            yield result

    protocol.on_headers_complete = on_headers_complete  # type: ignore[method-assign]
    cycle_class.run_asgi = run_asgi_marked  # type: ignore[method-assign]
    cycle_class.send = send_marked  # type: ignore[method-assign]
    guard.GuardMiddleware.__call__ = guard_marked  # type: ignore[method-assign]
    client_module.TritonLLMClient.stream = stream_marked  # type: ignore[method-assign]


class _PatchOnServiceImport(importlib.abc.MetaPathFinder):
    """Patches once, when the worker imports `service` (the rest is importable by then)."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.done = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "service" and not self.done:
            self.done = True
            try:
                _patch(self.log)
            except Exception as error:  # reported by the benchmark, which then stops
                self.log.write(json.dumps({"probe_error": repr(error)}) + "\n")
        return None


if os.environ.get(LOG_ENV):
    sys.meta_path.insert(0, _PatchOnServiceImport(open(os.environ[LOG_ENV], "a", buffering=1)))
