"""In-flight batching loop shared by the synthetic and hf backends.

One background thread owns all generation state. Between decode steps it admits queued requests
(up to max_batch_size active), drops cancelled ones and retires finished ones; each step gives
every due request exactly one token. Results go to each request's Sink, so the loop knows
nothing about Triton. A GenRequest is one sequence: a Triton request with several rows or
num_return_sequences > 1 arrives as several GenRequests, each taking its own batch slot.

A stream interval N > 1 (the LLM API's `stream_interval`) hands a streaming request's tokens to
its sink N at a time: the first token at once, then every N tokens, and the rest when it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from .request import FinishReason, GenRequest, TopLogprobs

log = logging.getLogger(__name__)

# Requests due within this window of the earliest one advance in the same step, so near-equal
# synthetic delays do not split one decode step into many.
_COALESCE_S = 0.001


class Backend(Protocol):
    """Produces one token per request per step."""

    ttft_s: float  # delay before a request's first token (synthetic); 0 for real compute
    itl_s: float  # delay between tokens (synthetic); 0 for real compute
    takes_images: bool  # a vision-language model: requests may carry images

    def admit(self, req: GenRequest) -> None:
        """Per-request setup when it joins the active batch."""

    def step(self, batch: list[GenRequest]) -> list[StepResult]:
        """One (token, log prob, top-k alternatives) per request, honouring
        req.banned_tokens(); the alternatives are None unless req.top_logprobs > 0."""

    def release(self, req: GenRequest) -> None:
        """Free per-request state (KV cache) when it leaves."""


StepResult = tuple[int, float, TopLogprobs | None]
"""What a backend produced for one request in one step: token, its log prob, alternatives."""


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    active: int
    queued: int
    finished: int
    cancelled: int
    failed: int
    generated_tokens: int


class Scheduler:
    """Owns the batching thread. submit()/cancel() are thread-safe; everything else runs inside."""

    def __init__(
        self,
        backend: Backend,
        max_batch_size: int,
        *,
        cancel_poll_interval_s: float = 0.0,
        stream_interval: int = 1,
        name: str = "cpu-engine-scheduler",
    ) -> None:
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be 1 or more, got {stream_interval}")
        self._backend = backend
        self._stream_interval = stream_interval
        self._max_batch_size = max_batch_size
        self._cancel_poll_interval_s = cancel_poll_interval_s
        self._cond = threading.Condition()
        self._incoming: list[GenRequest] = []
        self._queue: deque[GenRequest] = deque()
        self._active: list[GenRequest] = []
        self._by_id: dict[str, list[GenRequest]] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._finished = 0
        self._cancelled = 0
        self._failed = 0
        self._generated = 0
        self._last_cancel_poll = 0.0

    # -- public, any thread -------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop; requests still in flight are finished as cancelled."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, req: GenRequest) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("scheduler is stopped")
            self._incoming.append(req)
            if req.request_id:
                self._by_id.setdefault(req.request_id, []).append(req)
            self._cond.notify()

    def cancel(self, request_id: str) -> int:
        """Cancel in-flight requests with this id (TensorRT-LLM's `stop` input): every sequence
        of a num_return_sequences request shares the id, so all of them stop. Returns how many."""
        with self._cond:
            reqs = self._by_id.get(request_id, [])
            for req in reqs:
                req.cancel()
            self._cond.notify()
            return len(reqs)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            active=len(self._active),
            queued=len(self._queue) + len(self._incoming),
            finished=self._finished,
            cancelled=self._cancelled,
            failed=self._failed,
            generated_tokens=self._generated,
        )

    # -- scheduler thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._iterate():
                pass
        except Exception:  # pragma: no cover - last resort: never leave requests hanging
            log.exception("CPU engine scheduler crashed")
        finally:
            for req in [*self._active, *self._queue, *self._incoming]:
                self._retire(req, FinishReason.CANCELLED)
            self._active.clear()
            self._queue.clear()
            self._incoming.clear()

    def _iterate(self) -> bool:
        """One pass: take new requests, admit, drop cancelled, run one step. False = stop."""
        with self._cond:
            while (
                not self._stopping and not self._incoming and not self._active and not self._queue
            ):
                self._cond.wait()
            if self._stopping:
                return False
            if self._incoming:
                self._queue.extend(self._incoming)
                self._incoming.clear()

        self._drop_cancelled()
        self._admit()
        if not self._active:
            return True

        now = time.monotonic()
        horizon = now + _COALESCE_S
        active = self._active
        due = [r for r in active if r.next_due <= horizon]
        if not due:
            wake_at = min(r.next_due for r in active)
            with self._cond:
                if not self._incoming and not self._stopping:
                    self._cond.wait(max(0.0, wake_at - time.monotonic()))
            return True

        try:
            results = self._backend.step(due)
        except Exception as exc:
            log.exception("CPU engine step failed")
            for req in due:
                req.sink.fail(req, f"CPU engine step failed: {exc}")
                self._retire(req, FinishReason.ERROR)
            self._active = [r for r in self._active if not r.finished]
            return True

        now_ns = time.time_ns()
        itl = self._backend.itl_s
        any_finished = False
        for req, (token, logprob, top) in zip(due, results, strict=True):
            req.next_due = now + itl
            if not req.first_token_ns:
                req.first_token_ns = now_ns
            req.last_token_ns = now_ns
            if self._accept_token(req, token, logprob, top):
                any_finished = True
        if any_finished:
            self._active = [r for r in self._active if not r.finished]
        return True

    def _accept_token(
        self, req: GenRequest, token: int, logprob: float, top: TopLogprobs | None
    ) -> bool:
        """Append one token, stream it (or hold it for the stream interval), and retire the
        request if it ended. True = finished."""
        generated = req.generated
        generated.append(token)
        self._generated += 1
        if req.return_log_probs:
            req.logprobs.append(logprob)
            req.cum_logprob += logprob
        if req.top_logprobs:
            req.top.append(top if top is not None else ([], []))
        reason: FinishReason | None = None
        if (
            token == req.end_id
            or req.guide_ended
            or (req.stop_token_ids and token in req.stop_token_ids)
        ):
            # TensorRT-LLM does not count end_id in the valid output; a guide ends on the stop
            # token that completes it.
            req.ended_on = token
            generated.pop()
            if req.return_log_probs:
                req.logprobs.pop()
                req.cum_logprob -= logprob
            if req.top_logprobs:
                req.top.pop()
            reason = FinishReason.END_ID
        elif req.stop_words and req.stop_word_matched():
            reason = FinishReason.STOP_WORDS
        elif len(generated) >= req.max_new_tokens:
            reason = FinishReason.LENGTH
        if req.streaming:
            held = len(generated) - req.sent
            if reason is not None or req.sent == 0 or held >= self._stream_interval:
                self._send(req, reason is not None)
        if reason is None:
            return False
        self._retire(req, reason)
        return True

    @staticmethod
    def _send(req: GenRequest, final: bool) -> None:
        """Hand a streaming request's unsent tokens to its sink (none: an empty final one)."""
        sent = req.sent
        req.sent = len(req.generated)
        req.sink.send_tokens(req, req.chunk(sent), final)

    def _admit(self) -> None:
        queue = self._queue
        while queue and len(self._active) < self._max_batch_size:
            req = queue.popleft()
            if req.cancel_requested:
                self._retire(req, FinishReason.CANCELLED)
                continue
            req.first_scheduled_ns = time.time_ns()
            req.next_due = time.monotonic() + self._backend.ttft_s
            try:
                if req.images and not self._backend.takes_images:
                    raise ValueError("this model takes no images: send the prompt alone")
                self._backend.admit(req)
            except ValueError as exc:  # a bad request, not an engine fault
                req.sink.fail(req, f"CPU engine rejected the request: {exc}")
                self._retire(req, FinishReason.ERROR)
                continue
            except Exception as exc:
                log.exception("CPU engine could not admit a request")
                req.sink.fail(req, f"CPU engine could not admit the request: {exc}")
                self._retire(req, FinishReason.ERROR)
                continue
            self._active.append(req)

    def _drop_cancelled(self) -> None:
        """Retire requests cancelled by flag (every pass) or by their sink (polled, may be costly)."""
        poll = False
        if self._cancel_poll_interval_s <= 0:
            poll = True
        else:
            now = time.monotonic()
            if now - self._last_cancel_poll >= self._cancel_poll_interval_s:
                self._last_cancel_poll = now
                poll = True
        dropped = False
        for req in self._active:
            if req.cancel_requested or (poll and req.sink.is_cancelled()):
                req.cancel_requested = True
                self._retire(req, FinishReason.CANCELLED)
                dropped = True
        if dropped:
            self._active = [r for r in self._active if not r.finished]
        if poll and self._queue:
            kept: deque[GenRequest] = deque()
            for req in self._queue:
                if req.cancel_requested or req.sink.is_cancelled():
                    self._retire(req, FinishReason.CANCELLED)
                else:
                    kept.append(req)
            self._queue = kept

    def _retire(self, req: GenRequest, reason: FinishReason) -> None:
        if req.finished:
            return
        req.finished = True
        req.finish_reason = reason
        try:
            self._backend.release(req)
        except Exception:  # pragma: no cover
            log.exception("CPU engine release failed")
        if reason is FinishReason.CANCELLED:
            self._cancelled += 1
        elif reason is FinishReason.ERROR:
            self._failed += 1
        else:
            self._finished += 1
        if req.request_id:
            with self._cond:
                reqs = self._by_id.get(req.request_id)
                if reqs is not None:
                    try:
                        reqs.remove(req)
                    except ValueError:
                        pass
                    if not reqs:
                        del self._by_id[req.request_id]
        if reason is not FinishReason.ERROR:
            try:
                if (
                    req.streaming
                    and reason is FinishReason.CANCELLED
                    and req.sent < len(req.generated)
                ):
                    self._send(req, False)  # tokens held for the stream interval go out first
                req.sink.finish(req, reason)
            except Exception:
                log.exception("CPU engine sink failed to finish a request")
