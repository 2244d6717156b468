"""Batched inter-token latency: the exported histogram equals one observe() per token."""

from __future__ import annotations

import prometheus_client as prom
import pytest

from tensorrtllm_backend.serving.metrics import TokenGapHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0)


def _histogram(registry: prom.CollectorRegistry) -> prom.Histogram:
    return prom.Histogram("itl_seconds", "gaps", ["api"], buckets=BUCKETS, registry=registry)


def _samples(registry: prom.CollectorRegistry) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels.get("le", "")): sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if not sample.name.endswith("_created")
    }


def test_batched_gaps_export_the_same_buckets_and_sum_as_observe() -> None:
    batched_registry, reference_registry = prom.CollectorRegistry(), prom.CollectorRegistry()
    batched = TokenGapHistogram(_histogram(batched_registry).labels("native"), flush_every=5)
    reference = _histogram(reference_registry).labels("native")
    # Bounds themselves (a value equal to a bound is in that bucket), +Inf, several per delivery.
    deliveries = [(0.0005, 1), (0.001, 2), (0.0100001, 1), (0.1, 3), (2.5, 1), (0.05, 4)]
    for gap, count in deliveries:
        batched.add(gap, count)
        for _ in range(count):
            reference.observe(gap)
    batched.flush()
    got, want = _samples(batched_registry), _samples(reference_registry)
    assert got == pytest.approx(want)  # the sum differs in its last bits: added in another order
    assert _samples(batched_registry)[("itl_seconds_count", "")] == 12


def test_gaps_are_exported_every_flush_every_tokens_and_at_flush() -> None:
    registry = prom.CollectorRegistry()
    gaps = TokenGapHistogram(_histogram(registry).labels("native"), flush_every=3)
    gaps.add(0.02, 2)
    assert _samples(registry)[("itl_seconds_count", "")] == 0  # still buffered
    gaps.add(0.02, 1)
    assert _samples(registry)[("itl_seconds_count", "")] == 3
    gaps.add(0.5, 1)
    gaps.flush()
    gaps.flush()  # nothing pending: no double count
    samples = _samples(registry)
    assert samples[("itl_seconds_count", "")] == 4
    assert samples[("itl_seconds_sum", "")] == pytest.approx(0.02 * 3 + 0.5)


def test_a_histogram_without_the_internals_gets_one_observe_per_token() -> None:
    class PlainHistogram:
        def __init__(self) -> None:
            self.observed: list[float] = []

        def observe(self, amount: float) -> None:
            self.observed.append(amount)

    plain = PlainHistogram()
    gaps = TokenGapHistogram(plain)
    gaps.add(0.03, 3)
    gaps.flush()
    assert plain.observed == [0.03, 0.03, 0.03]
