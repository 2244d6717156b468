"""Publishes scheduler counters as Triton custom metrics (pb_utils.MetricFamily).

Each metric update is an IPC round trip from the python stub to tritonserver, so the scheduler
loop never touches metrics: a small thread copies changed counters every `interval_s` instead,
and stops once tritonserver is gone (an IPC call to a dead parent blocks forever, holding the GIL).
They appear on Triton's metrics endpoint (/metrics), e.g.
trtllm_cpu_engine_active_requests{model="tensorrt_llm",version="1"} 3.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .scheduler import Scheduler

GAUGES = {
    "active": ("trtllm_cpu_engine_active_requests", "Requests in the running batch"),
    "queued": ("trtllm_cpu_engine_queued_requests", "Requests waiting for a batch slot"),
}
COUNTERS = {
    "finished": ("trtllm_cpu_engine_finished_requests_total", "Requests completed normally"),
    "cancelled": ("trtllm_cpu_engine_cancelled_requests_total", "Requests cancelled in flight"),
    "failed": ("trtllm_cpu_engine_failed_requests_total", "Requests failed inside the engine"),
    "generated_tokens": ("trtllm_cpu_engine_generated_tokens_total", "Tokens generated"),
}


class MetricsPublisher:
    """Background thread: scheduler.stats() -> Triton gauges and counters."""

    def __init__(
        self, pb: Any, scheduler: Scheduler, labels: dict[str, str], interval_s: float = 0.1
    ) -> None:
        self._scheduler = scheduler
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._metrics: dict[str, Any] = {}
        self._families: list[Any] = []
        for key, (name, description) in GAUGES.items():
            family = pb.MetricFamily(name=name, description=description, kind=pb.MetricFamily.GAUGE)
            self._families.append(family)
            self._metrics[key] = family.Metric(labels=labels)
        for key, (name, description) in COUNTERS.items():
            family = pb.MetricFamily(
                name=name, description=description, kind=pb.MetricFamily.COUNTER
            )
            self._families.append(family)
            self._metrics[key] = family.Metric(labels=labels)
        self._published: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._gauges: dict[str, int] = {}
        self._parent_pid = os.getppid()
        self._thread = threading.Thread(target=self._run, name="cpu-engine-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Call from the model's finalize: besides the thread, this releases the metric objects
        while the stub can still reach tritonserver. A MetricFamily left to the interpreter's
        exit is destroyed after the stub's shared memory is gone, and the stub segfaults (a core
        file in the working directory at every shutdown where core dumps are on)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)
        if not self._thread.is_alive():  # else a publish may still use them: leave them be
            self._metrics.clear()
            self._families.clear()

    def publish(self) -> None:
        """Push what changed since the last call (an idle model makes no IPC calls at all)."""
        if os.getppid() != self._parent_pid:
            self._stop.set()  # tritonserver is gone: an IPC call now would never return
            return
        stats = self._scheduler.stats()
        for key in GAUGES:
            value = getattr(stats, key)
            if value != self._gauges.get(key):
                self._metrics[key].set(float(value))
                self._gauges[key] = value
        for key in COUNTERS:
            value = getattr(stats, key)
            delta = value - self._published[key]
            if delta > 0:
                self._metrics[key].increment(float(delta))
                self._published[key] = value

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.publish()
            except Exception:  # pragma: no cover - metrics must never break serving
                pass
