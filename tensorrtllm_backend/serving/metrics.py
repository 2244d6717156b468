"""Prometheus metrics of the generation path, exported on BentoML's `/metrics`.

Create :class:`GenerationMetrics` inside the service (not at import): BentoML switches
prometheus_client to multiprocess mode when its worker starts, after service.py is imported.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from typing import Any

from ..settings import load_settings

request_log = logging.getLogger("bentoml.trtllm.requests")

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


class GenerationMetrics:
    """TTFT, inter-token latency, end-to-end latency, tokens, in-flight requests, errors."""

    def __init__(self, namespace: str = "trtllm") -> None:
        import prometheus_client as prom

        self.log_requests = load_settings().log_requests  # TRTLLM_LOG_REQUESTS

        def metric(kind: Any, name: str, documentation: str, *labels: str, **options: Any) -> Any:
            return kind(f"{namespace}_{name}", documentation, ["api", *labels], **options)

        self.time_to_first_token = metric(
            prom.Histogram,
            "time_to_first_token_seconds",
            "Time from request to its first generated token.",
            buckets=_LATENCY_BUCKETS,
        )
        self.inter_token_latency = metric(
            prom.Histogram,
            "inter_token_latency_seconds",
            "Time between generated tokens after the first.",
            buckets=_LATENCY_BUCKETS,
        )
        self.request_duration = metric(
            prom.Histogram,
            "request_duration_seconds",
            "End-to-end generation latency.",
            buckets=_E2E_BUCKETS,
        )
        self.prompt_tokens = metric(prom.Counter, "prompt_tokens", "Prompt tokens processed.")
        self.completion_tokens = metric(prom.Counter, "completion_tokens", "Tokens generated.")
        self.requests = metric(
            prom.Counter, "requests", "Finished requests by finish reason.", "finish_reason"
        )
        self.errors = metric(prom.Counter, "request_errors", "Failed requests by kind.", "kind")
        self.in_flight = metric(
            prom.Gauge,
            "requests_in_flight",
            "Requests being generated.",
            multiprocess_mode="livesum",
        )

    def record_rejected(self, api: str, kind: str) -> None:
        self.errors.labels(api, kind).inc()

    def track(self, api: str, prompt_tokens: int, request_id: str = "") -> RequestTracker:
        self.in_flight.labels(api).inc()
        self.prompt_tokens.labels(api).inc(prompt_tokens)
        return RequestTracker(self, api, prompt_tokens, request_id)


class TokenGapHistogram:
    """One request's inter-token gaps, added to a Histogram child in batches.

    In BentoML's multiprocess mode each `observe()` writes two mmap'd values under a lock; at one
    observation per streamed token that was the largest cost of the metrics. The gaps are counted
    per bucket here and added every `flush_every` tokens and at the end of the request: the same
    buckets and sum, a few writes per request. This needs the child's value objects
    (prometheus_client internals, stable since 0.4); without them it falls back to `observe()`.
    """

    __slots__ = ("_bounds", "_child", "_counts", "_flush_every", "_pending", "_sum")

    def __init__(self, child: Any, flush_every: int = 64) -> None:
        self._child = child
        self._flush_every = flush_every
        batched = all(hasattr(child, name) for name in ("_upper_bounds", "_buckets", "_sum"))
        self._bounds: list[float] | None = list(child._upper_bounds) if batched else None
        self._counts = [0] * len(self._bounds or ())
        self._sum = 0.0
        self._pending = 0

    def add(self, gap: float, count: int) -> None:
        """`count` tokens that each came `gap` seconds after the previous one."""
        if self._bounds is None:
            for _ in range(count):
                self._child.observe(gap)
            return
        # observe() counts a value in the first bucket whose upper bound is >= the value.
        self._counts[bisect.bisect_left(self._bounds, gap)] += count
        self._sum += gap * count
        self._pending += count
        if self._pending >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        buckets = self._child._buckets
        for index, count in enumerate(self._counts):
            if count:
                buckets[index].inc(count)
                self._counts[index] = 0
        self._child._sum.inc(self._sum)
        self._sum = 0.0
        self._pending = 0


class RequestTracker:
    """Timing of one request, fed inline by the generation loop (no extra generator layer on the
    per-token path). Per-token latency is the gap divided by the tokens that arrived together,
    so batched deliveries are not counted as zero-latency tokens."""

    __slots__ = (
        "_api", "_first", "_itl", "_last", "_metrics", "_prompt_tokens", "_request_id", "_start",
        "finish", "generated",
    )  # fmt: skip

    def __init__(
        self, metrics: GenerationMetrics, api: str, prompt_tokens: int, request_id: str
    ) -> None:
        self._metrics = metrics
        self._api = api
        self._prompt_tokens = prompt_tokens
        self._request_id = request_id
        self._first = 0.0
        self._itl = TokenGapHistogram(metrics.inter_token_latency.labels(api))
        self._start = self._last = time.perf_counter()
        self.generated = 0
        self.finish = "incomplete"

    def tokens(self, count: int) -> None:
        if not count:
            return
        now = time.perf_counter()
        if not self.generated:
            self._first = now - self._start
            self._metrics.time_to_first_token.labels(self._api).observe(self._first)
            count_after_first = count - 1
        else:
            count_after_first = count
        if count_after_first:
            self._itl.add((now - self._last) / count_after_first, count_after_first)
        self._last = now
        self.generated += count

    def close(self, error: BaseException | None) -> None:
        metrics, api = self._metrics, self._api
        if error is not None:
            cancelled = isinstance(error, GeneratorExit | asyncio.CancelledError)
            if not cancelled:
                metrics.errors.labels(api, type(error).__name__).inc()
            self.finish = "cancelled" if cancelled else "error"
        duration = time.perf_counter() - self._start
        self._itl.flush()
        metrics.in_flight.labels(api).dec()
        metrics.completion_tokens.labels(api).inc(self.generated)
        metrics.requests.labels(api, self.finish).inc()
        metrics.request_duration.labels(api).observe(duration)
        if metrics.log_requests:
            # key=value pairs, one line per request; never the prompt or the output.
            request_log.info(
                "request_id=%s api=%s finish=%s prompt_tokens=%d completion_tokens=%d "
                "ttft_ms=%.1f duration_ms=%.1f",
                self._request_id, api, self.finish, self._prompt_tokens, self.generated,
                self._first * 1000, duration * 1000,
            )  # fmt: skip


_metrics: GenerationMetrics | None = None


def generation_metrics() -> GenerationMetrics:
    """The process-wide instance (prometheus_client refuses to register a name twice)."""
    global _metrics
    if _metrics is None:
        _metrics = GenerationMetrics()
    return _metrics
