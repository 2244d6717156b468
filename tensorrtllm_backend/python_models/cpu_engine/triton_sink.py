"""Scheduler events -> pb_utils responses with TensorRT-LLM's output shapes.

One ResponseGroup per Triton request; one SequenceSink (the scheduler's Sink) per sequence in
it: rows x num_return_sequences. Decoupled: every sequence's responses go through the request's
response sender, tagged with batch_index (its row) and sequence_index (which of the row's
num_return_sequences it is); streaming sequences interleave token by token, non-streaming ones
send one whole response each. The FINAL flag rides the last response of the last sequence to
finish (as TensorRT-LLM sends it with the last response). Not decoupled: one sequence per row
(num_return_sequences > 1 is rejected before), merged into one response ([B, 1, len] padded)
that execute() returns.
Shapes (max_batch_size > 0, beam 1): output_ids [1, 1, n], sequence_length [1, 1],
cum_log_probs [1, 1], output_log_probs [1, 1, n], batch_index / sequence_index [1, 1], and for
top_log_probs = k: output_top_token_ids / output_top_log_probs [1, 1, n, k] (the k most likely
tokens at each position, the most likely first).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .request import Chunk, FinishReason, GenRequest, TopLogprobs

_PERF_OUTPUTS = (
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
)
# [[i]] int32 tensors of the per-token path (sequence_length, batch_index, sequence_index):
# built once and reused, never mutated.
_CELLS = tuple(np.array([[i]], dtype=np.int32) for i in range(64))


def _cell(i: int) -> np.ndarray:
    return _CELLS[i] if 0 <= i < len(_CELLS) else np.array([[i]], dtype=np.int32)


# The C++ backend's perf output: KV-cache blocks the request reused (x tokens_per_block = its
# cached prompt tokens).
REUSED_BLOCKS = "kv_cache_reused_blocks"


def _ns(req: GenRequest) -> tuple[int, int, int, int]:
    return req.arrival_ns, req.first_scheduled_ns, req.first_token_ns, req.last_token_ns


def top_tensors(pb: Any, top: list[TopLogprobs], k: int, shape: tuple[int, ...]) -> list[Any]:
    """output_top_token_ids / output_top_log_probs of `top` (one entry per token), each
    reshaped to `shape` + (k,)."""
    ids = np.array([entry[0] for entry in top], dtype=np.int32).reshape(*shape, k)
    values = np.array([entry[1] for entry in top], dtype=np.float32).reshape(*shape, k)
    return [pb.Tensor("output_top_token_ids", ids), pb.Tensor("output_top_log_probs", values)]


def send_response(sender: Any, response: Any, flags: int) -> bool:
    """Send one response (None: the flags alone) on a response sender; False when the client is
    gone (a cancelled stream raises), which the scheduler learns at its next poll."""
    try:
        if response is None:
            sender.send(flags=flags)
        else:
            sender.send(response, flags=flags)
    except Exception:
        return False
    return True


class ResponseGroup:
    """The response side of one Triton request shared by its sequences."""

    def __init__(
        self,
        pb: Any,
        request: Any,
        *,
        decoupled: bool,
        sequences: int = 1,
        perf_metrics: bool = False,
    ) -> None:
        self._pb = pb
        self._request = request
        self._sender = request.get_response_sender() if decoupled else None
        self._lock = threading.Lock()
        self._pending = sequences  # sequences that have not sent their last response yet
        self._closed = False
        self._client_cancelled = False
        self._done = threading.Event()
        self._results: dict[int, tuple[GenRequest, list[int]] | str] = {}
        self.perf_metrics = perf_metrics
        self.response: Any = None  # non-decoupled: what execute() returns
        # Each output tensor costs time per streamed token: build batch/sequence_index only when
        # asked for (a client that names no outputs gets all of them, so they are then listed).
        try:
            wanted = request.requested_output_names()
        except Exception:
            wanted = ("batch_index",)
        self._want_indices = "batch_index" in wanted or "sequence_index" in wanted

    def set_sequences(self, sequences: int, perf_metrics: bool) -> None:
        """How many sequences (rows x num_return_sequences) must finish before FINAL."""
        self._pending = sequences
        self.perf_metrics = perf_metrics

    def sink(self) -> SequenceSink:
        """The Sink of one more sequence of this request."""
        return SequenceSink(self)

    # -- used by SequenceSink ------------------------------------------------------------------
    def emit(self, req: GenRequest, chunk: Chunk, sequence_final: bool) -> None:
        """Decoupled: send one sequence's response; FINAL when it is the last response of the
        last sequence (sequence_final: this sequence's last response)."""
        pb = self._pb
        tokens, logprobs, top = chunk
        n = len(tokens)
        tensors = [
            pb.Tensor("output_ids", np.array(tokens, dtype=np.int32).reshape(1, 1, n)),
            pb.Tensor("sequence_length", _cell(n)),
        ]
        if self._want_indices:
            tensors.append(pb.Tensor("batch_index", _cell(req.batch_index)))
            tensors.append(pb.Tensor("sequence_index", _cell(req.sequence_index)))
        if logprobs is not None:
            tensors.append(
                pb.Tensor("output_log_probs", np.array(logprobs, dtype=np.float32).reshape(1, 1, n))
            )
            tensors.append(
                pb.Tensor("cum_log_probs", np.array([[req.cum_logprob]], dtype=np.float32))
            )
        if top is not None:
            tensors += top_tensors(pb, top, req.top_logprobs, (1, 1, n))
        if req.prompt_logits is not None:  # with the first response, as the C++ backend
            tensors.append(pb.Tensor("context_logits", req.prompt_logits[None]))
            req.prompt_logits = None
        if self.perf_metrics and sequence_final:
            for name, value in zip(_PERF_OUTPUTS, _ns(req), strict=True):
                tensors.append(pb.Tensor(name, np.array([[value]], dtype=np.int64)))
            tensors.append(pb.Tensor(REUSED_BLOCKS, _cell(req.reused_blocks)))
        self._send_decoupled(pb.InferenceResponse(output_tensors=tensors), sequence_final)

    def sequence_done(self, req: GenRequest, tokens: list[int] | None, error: str | None) -> None:
        """A sequence finished without a data response of its own (decoupled) or with its
        complete output (not decoupled: one sequence per row)."""
        if self._sender is not None:
            if error is not None:
                response = self._pb.InferenceResponse(
                    output_tensors=[], error=self._pb.TritonError(error)
                )
                self._send_decoupled(response, True)
            else:
                self._send_decoupled(None, True)
            return
        with self._lock:
            self._results[req.batch_index] = error if error is not None else (req, tokens or [])
            self._pending -= 1
            if self._pending > 0 or self._closed:
                return
            self._closed = True
        self.response = self._merged()
        self._done.set()

    def fail_all(self, message: str) -> None:
        """The whole request is rejected before any sequence started."""
        error = self._pb.InferenceResponse(output_tensors=[], error=self._pb.TritonError(message))
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._pending = 0
        if self._sender is not None:
            self._sender_send(error, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            self.response = error
            self._done.set()

    def is_cancelled(self) -> bool:
        if self._client_cancelled:
            return True
        source = self._sender if self._sender is not None else self._request
        try:
            self._client_cancelled = bool(source.is_cancelled())
        except Exception:
            self._client_cancelled = False
        return self._client_cancelled

    @property
    def client_cancelled(self) -> bool:
        return self._client_cancelled

    @property
    def decoupled(self) -> bool:
        return self._sender is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Non-decoupled execute(): block until the merged response exists."""
        return self._done.wait(timeout)

    # -- internals -----------------------------------------------------------------------------
    def _send_decoupled(self, response: Any, sequence_final: bool) -> None:
        flags = 0
        if sequence_final:
            with self._lock:
                if self._closed:
                    return
                self._pending -= 1
                if self._pending <= 0:
                    self._closed = True
                    flags = self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        elif self._closed:
            return
        if response is None and not flags:
            return  # a sequence ended silently while others still run
        self._sender_send(response, flags)

    def _sender_send(self, response: Any, flags: int) -> None:
        if not send_response(self._sender, response, flags):
            self._client_cancelled = True

    def _merged(self) -> Any:
        """Non-decoupled: all rows in one response, output_ids [B, 1, max_len] padded."""
        pb = self._pb
        rows = [self._results[i] for i in sorted(self._results)]
        for result in rows:
            if isinstance(result, str):
                return pb.InferenceResponse(output_tensors=[], error=pb.TritonError(result))
        width = max(len(tokens) for _, tokens in rows)  # type: ignore[misc]
        lp_width = max(len(req.logprobs) for req, _ in rows)  # type: ignore[misc]
        batch = len(rows)
        ids = np.zeros((batch, 1, width), dtype=np.int32)
        lengths = np.zeros((batch, 1), dtype=np.int32)
        cum = np.zeros((batch, 1), dtype=np.float32)
        logprobs = np.zeros((batch, 1, lp_width), dtype=np.float32)
        perf = np.zeros((len(_PERF_OUTPUTS), batch, 1), dtype=np.int64)
        for b, (req, tokens) in enumerate(rows):  # type: ignore[misc]
            pad = req.pad_id if req.pad_id is not None else (req.end_id or 0)
            ids[b, 0, :] = pad
            ids[b, 0, : len(tokens)] = tokens
            lengths[b, 0] = len(tokens)
            cum[b, 0] = req.cum_logprob
            logprobs[b, 0, : len(req.logprobs)] = req.logprobs
            perf[:, b, 0] = _ns(req)
        tensors = [
            pb.Tensor("output_ids", ids),
            pb.Tensor("sequence_length", lengths),
            pb.Tensor("batch_index", np.arange(batch, dtype=np.int32).reshape(batch, 1)),
            pb.Tensor("sequence_index", np.zeros((batch, 1), np.int32)),
        ]
        first: GenRequest = rows[0][0]  # type: ignore[index,assignment]
        if first.return_log_probs:
            tensors.append(pb.Tensor("cum_log_probs", cum))
            tensors.append(pb.Tensor("output_log_probs", logprobs))
        if first.top_logprobs:
            # Positions past a row's own output repeat no token: id -1, log prob -inf.
            k = first.top_logprobs
            top_width = max(len(req.top) for req, _ in rows)  # type: ignore[misc]
            top_ids = np.full((batch, 1, top_width, k), -1, dtype=np.int32)
            top_values = np.full((batch, 1, top_width, k), -np.inf, dtype=np.float32)
            for b, (req, _) in enumerate(rows):  # type: ignore[misc]
                for position, (ids_row, values_row) in enumerate(req.top):
                    top_ids[b, 0, position] = ids_row
                    top_values[b, 0, position] = values_row
            tensors.append(pb.Tensor("output_top_token_ids", top_ids))
            tensors.append(pb.Tensor("output_top_log_probs", top_values))
        if first.context_logits:
            tensors.append(pb.Tensor("context_logits", _padded_logits([req for req, _ in rows])))  # type: ignore[misc]
        if self.perf_metrics:
            for name, values in zip(_PERF_OUTPUTS, perf, strict=True):
                tensors.append(pb.Tensor(name, values))
            reused = [[req.reused_blocks] for req, _ in rows]  # type: ignore[misc]
            tensors.append(pb.Tensor(REUSED_BLOCKS, np.array(reused, dtype=np.int32)))
        return pb.InferenceResponse(output_tensors=tensors)


def _padded_logits(reqs: list[GenRequest]) -> np.ndarray:
    """The rows' prompt logits as one [B, longest prompt, vocab] tensor, zero past each
    prompt."""
    matrices = [np.asarray(req.prompt_logits) for req in reqs]
    width = max(matrix.shape[0] for matrix in matrices)
    out = np.zeros((len(matrices), width, matrices[0].shape[1]), dtype=np.float32)
    for row, matrix in enumerate(matrices):
        out[row, : matrix.shape[0]] = matrix
    return out


class SequenceSink:
    """The scheduler's Sink for one sequence of a request (its indexes live on the GenRequest)."""

    __slots__ = ("_group",)

    def __init__(self, group: ResponseGroup) -> None:
        self._group = group

    def send_tokens(self, req: GenRequest, chunk: Chunk, final: bool) -> None:
        self._group.emit(req, chunk, final)

    def finish(self, req: GenRequest, reason: FinishReason) -> None:
        group = self._group
        if req.streaming:
            if reason is FinishReason.CANCELLED:
                if group.client_cancelled:
                    group.sequence_done(req, None, None)  # nobody listens: just release
                else:  # stop=true: end the stream with an empty final response
                    group.emit(req, req.chunk(len(req.generated)), True)
            return  # other reasons: the final data response was already sent
        if reason is FinishReason.CANCELLED and group.client_cancelled:
            group.sequence_done(req, None, None)
            return
        tokens = req.generated if req.exclude_input_in_output else req.prompt + req.generated
        if group.decoupled:
            # Log probs cover the generated tokens only, also when the prompt is returned.
            group.emit(req, req.chunk()._replace(tokens=tokens), True)
        else:
            group.sequence_done(req, tokens, None)

    def fail(self, req: GenRequest, message: str) -> None:
        self._group.sequence_done(req, None, message)

    def is_cancelled(self) -> bool:
        return self._group.is_cancelled()
