"""Prometheus metrics of the generation path, exported on BentoML's `/metrics`.

Create :class:`GenerationMetrics` inside the service (not at import): BentoML switches
prometheus_client to multiprocess mode when its worker starts, after service.py is imported.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from .schemas import GenerationChunk

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

        self.time_to_first_token = prom.Histogram(
            f"{namespace}_time_to_first_token_seconds",
            "Time from request to its first generated token.",
            ["api"],
            buckets=_LATENCY_BUCKETS,
        )
        self.inter_token_latency = prom.Histogram(
            f"{namespace}_inter_token_latency_seconds",
            "Time between generated tokens after the first.",
            ["api"],
            buckets=_LATENCY_BUCKETS,
        )
        self.request_duration = prom.Histogram(
            f"{namespace}_request_duration_seconds",
            "End-to-end generation latency.",
            ["api"],
            buckets=_E2E_BUCKETS,
        )
        self.prompt_tokens = prom.Counter(
            f"{namespace}_prompt_tokens", "Prompt tokens processed.", ["api"]
        )
        self.completion_tokens = prom.Counter(
            f"{namespace}_completion_tokens", "Tokens generated.", ["api"]
        )
        self.requests = prom.Counter(
            f"{namespace}_requests", "Finished requests by finish reason.", ["api", "finish_reason"]
        )
        self.errors = prom.Counter(
            f"{namespace}_request_errors", "Failed requests by kind.", ["api", "kind"]
        )
        self.in_flight = prom.Gauge(
            f"{namespace}_requests_in_flight",
            "Requests being generated.",
            ["api"],
            multiprocess_mode="livesum",
        )

    def record_rejected(self, api: str, kind: str) -> None:
        self.errors.labels(api, kind).inc()

    async def observe(
        self, api: str, prompt_tokens: int, chunks: AsyncIterator[GenerationChunk]
    ) -> AsyncIterator[GenerationChunk]:
        """Pass chunks through, timing them. Per-token latency is the gap divided by the tokens
        that arrived together, so batched deliveries are not counted as zero-latency tokens."""
        start = last = time.perf_counter()
        first_seen = False
        generated = 0
        finish = "incomplete"
        itl = self.inter_token_latency.labels(api)
        self.in_flight.labels(api).inc()
        self.prompt_tokens.labels(api).inc(prompt_tokens)
        try:
            async for chunk in chunks:
                count = len(chunk.token_ids)
                if count:
                    now = time.perf_counter()
                    if not first_seen:
                        self.time_to_first_token.labels(api).observe(now - start)
                        first_seen = True
                        count -= 1
                    if count:
                        gap = (now - last) / count
                        for _ in range(count):
                            itl.observe(gap)
                    last = now
                    generated += len(chunk.token_ids)
                if chunk.finish_reason is not None:
                    finish = chunk.finish_reason.value
                yield chunk
        except BaseException as error:
            kind = "cancelled" if isinstance(error, GeneratorExit) else type(error).__name__
            if kind != "cancelled":
                self.errors.labels(api, kind).inc()
            finish = "cancelled" if kind == "cancelled" else "error"
            raise
        finally:
            self.in_flight.labels(api).dec()
            self.completion_tokens.labels(api).inc(generated)
            self.requests.labels(api, finish).inc()
            self.request_duration.labels(api).observe(time.perf_counter() - start)


_metrics: GenerationMetrics | None = None


def generation_metrics() -> GenerationMetrics:
    """The process-wide instance (prometheus_client refuses to register a name twice)."""
    global _metrics
    if _metrics is None:
        _metrics = GenerationMetrics()
    return _metrics
