"""Shared helpers for the CPU engine unit tests: a recording Sink (the scheduler's seam)."""

from __future__ import annotations

import threading

from tensorrtllm_backend.python_models.cpu_engine.request import (
    Chunk,
    FinishReason,
    GenRequest,
    TopLogprobs,
)
from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler

VOCAB = 2048  # the synthetic backend's vocabulary in these tests
EOS = 2


class RecordingSink:
    """Collects what the scheduler sends for one request; `cancelled` simulates a client leaving."""

    def __init__(self) -> None:
        self.chunks: list[tuple[list[int], list[float] | None, bool]] = []
        self.tops: list[list[TopLogprobs] | None] = []  # the alternatives sent with each chunk
        self.reason: FinishReason | None = None
        self.error: str | None = None
        self.cancelled = False
        self.done = threading.Event()
        self.first_token = threading.Event()

    def send_tokens(self, req: GenRequest, chunk: Chunk, final: bool) -> None:
        tokens, logprobs, top = chunk
        self.chunks.append((list(tokens), None if logprobs is None else list(logprobs), final))
        self.tops.append(None if top is None else list(top))
        self.first_token.set()

    def finish(self, req: GenRequest, reason: FinishReason) -> None:
        self.reason = reason
        self.done.set()

    def fail(self, req: GenRequest, message: str) -> None:
        self.error = message
        self.done.set()

    def is_cancelled(self) -> bool:
        return self.cancelled

    def streamed(self) -> list[int]:
        return [t for tokens, _, _ in self.chunks for t in tokens]


def make_request(
    prompt: list[int], max_new_tokens: int, **kwargs
) -> tuple[GenRequest, RecordingSink]:
    sink = RecordingSink()
    return GenRequest(prompt=prompt, max_new_tokens=max_new_tokens, sink=sink, **kwargs), sink


def run_to_end(
    scheduler: Scheduler, requests: list[tuple[GenRequest, RecordingSink]], timeout: float = 120.0
) -> list[list[int]]:
    """Submit every request, wait until each has finished without an error; what each generated."""
    for req, _ in requests:
        scheduler.submit(req)
    for _, sink in requests:
        assert sink.done.wait(timeout)
        assert sink.error is None, sink.error
    return [req.generated for req, _ in requests]


def make_sequences(
    prompt: list[int], max_new_tokens: int, count: int, **kwargs
) -> list[tuple[GenRequest, RecordingSink]]:
    """The `count` GenRequests one Triton row with num_return_sequences = count becomes
    (triton_io.split_sequences, the same split parse_request does), each with its own sink."""
    from tensorrtllm_backend.python_models.cpu_engine.request import SamplingParams
    from tensorrtllm_backend.python_models.cpu_engine.triton_io import split_sequences

    row = {
        "prompt": prompt,
        "max_new_tokens": max_new_tokens,
        "sequence_index": 0,
        "sampling": kwargs.pop("sampling", None) or SamplingParams(),
        **kwargs,
    }
    pairs = []
    for arguments in split_sequences(row, count):
        sink = RecordingSink()
        pairs.append((GenRequest(sink=sink, **arguments), sink))
    return pairs


def run_on(backend, requests: list[tuple[GenRequest, RecordingSink]]) -> list[list[int]]:
    """run_to_end on a scheduler of its own over `backend`, stopped afterwards."""
    from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler

    scheduler = Scheduler(backend, max_batch_size=8)
    scheduler.start()
    try:
        return run_to_end(scheduler, requests)
    finally:
        scheduler.stop()
