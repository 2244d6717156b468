"""Fixtures shared by the CPU engine's unit tests (python_models/cpu_engine)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from cpu_engine_helpers import EOS, VOCAB

from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler
from tensorrtllm_backend.python_models.cpu_engine.synthetic import SyntheticBackend


@pytest.fixture
def make_scheduler() -> Iterator[Callable[..., Scheduler]]:
    """Started schedulers over the synthetic backend (VOCAB, EOS), stopped after the test."""
    started: list[Scheduler] = []

    def factory(max_batch_size: int = 64, stream_interval: int = 1, **backend_kwargs) -> Scheduler:
        backend = SyntheticBackend(vocab_size=VOCAB, eos_token_id=EOS, **backend_kwargs)
        scheduler = Scheduler(backend, max_batch_size, stream_interval=stream_interval)
        scheduler.start()
        started.append(scheduler)
        return scheduler

    yield factory
    for scheduler in started:
        scheduler.stop()
