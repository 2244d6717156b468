"""Backend-neutral generation request and the sink it reports to.

The scheduler only knows these types, so it can be tested without Triton: model.py adapts a
Triton request into a GenRequest and a pb_utils response sender into a Sink.
"""

from __future__ import annotations

import enum
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


class FinishReason(str, enum.Enum):
    LENGTH = "length"  # request_output_len tokens produced
    END_ID = "end_id"  # end_id produced (not returned, as TensorRT-LLM)
    STOP_WORDS = "stop_words"  # a stop sequence matched (returned, as TensorRT-LLM)
    CANCELLED = "cancelled"  # client cancelled / stop=true
    ERROR = "error"  # the backend failed on this request


@dataclass(slots=True)
class SamplingParams:
    """TensorRT-LLM runtime defaults: top_k=0 and top_p=0 mean greedy; seed defaults to 0."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        if self.temperature <= 0.0 or self.top_k == 1:
            return True
        return self.top_k <= 0 and self.top_p <= 0.0


TopLogprobs = tuple[list[int], list[float]]
"""One token's top-k alternatives: their ids and log probs, the most likely first."""


class Chunk(NamedTuple):
    """Tokens handed to a sink at once, with their log probs and top-k alternatives (None
    where the request did not ask for them)."""

    tokens: list[int]
    logprobs: list[float] | None
    top: list[TopLogprobs] | None


class Sink(Protocol):
    """Where a request's results go (a Triton response sender in production)."""

    def send_tokens(self, req: GenRequest, chunk: Chunk, final: bool) -> None:
        """Streaming: the tokens produced since the last call (one per step, or up to the
        scheduler's stream interval); final=True marks the last response."""

    def finish(self, req: GenRequest, reason: FinishReason) -> None:
        """The request left the engine. Streaming sinks that have not yet sent a final
        response must send one; non-streaming sinks send the full output now."""

    def fail(self, req: GenRequest, message: str) -> None:
        """The request failed inside the engine."""

    def is_cancelled(self) -> bool:
        """Whether the client went away (polled by the scheduler between steps)."""


@dataclass(slots=True, eq=False)
class GenRequest:
    """One sequence to generate (beam width 1). Mutable state is owned by the scheduler thread.

    A Triton request row with num_return_sequences = N becomes N GenRequests (as TensorRT-LLM
    splits it into N child requests): same batch_index and request_id, sequence_index 0..N-1.
    """

    prompt: list[int]
    max_new_tokens: int
    sink: Sink
    request_id: str = ""
    end_id: int | None = None
    pad_id: int | None = None
    stop_words: list[list[int]] = field(default_factory=list)
    # Tokens that end the sequence like end_id (the LLM API's stop_token_ids): not returned.
    stop_token_ids: frozenset[int] = frozenset()
    bad_words: list[list[int]] = field(default_factory=list)
    min_tokens: int = 0
    streaming: bool = False
    exclude_input_in_output: bool = False
    return_log_probs: bool = False
    top_logprobs: int = 0  # alternatives to return per token (0: none)
    # return_context_logits: the prompt's logits [len(prompt), vocab] (float32), which the
    # backend sets while the prompt goes through its forward; sent once, then dropped.
    context_logits: bool = False
    prompt_logits: object = None
    # The prefix cache's blocks it reused, and their tokens (set at its join).
    reused_blocks: int = 0
    cached_tokens: int = 0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    embedding_bias: Sequence[float] | None = None
    # guided_decoding_guide_type / _guide as sent, and the grammar compiled from them (the
    # engine's GuideCompiler, shared by every sequence with the same guide).
    guided: tuple[str, str | None] | None = None
    grammar: object = None
    # A vision-language model's images (encoded), in the order of the prompt's image tokens.
    images: list[bytes] = field(default_factory=list)
    batch_index: int = 0  # row of the Triton request this sequence belongs to
    sequence_index: int = 0  # which of the row's num_return_sequences sequences this is
    arrival_ns: int = field(default_factory=time.time_ns)
    # Scheduler state.
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[TopLogprobs] = field(default_factory=list)  # per token, when top_logprobs > 0
    cum_logprob: float = 0.0
    sent: int = 0  # streaming: generated tokens already handed to the sink
    cancel_requested: bool = False
    finished: bool = False
    finish_reason: FinishReason | None = None
    first_scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    next_due: float = 0.0  # monotonic time the next token may be produced (synthetic delays)
    backend_state: object = None  # e.g. the KV cache of the hf backend
    # Set by the backend when the grammar accepted its last token (always a stop token): the
    # sequence then ends as on its end token.
    guide_ended: bool = False
    ended_on: int | None = None  # the end or stop token that ended the sequence

    def cache_key(self) -> bytes:
        """What the prefix cache keys this request's blocks by beyond their tokens: its images'
        contents (the same placeholder tokens stand for any image)."""
        return b"".join(hashlib.sha256(image).digest() for image in self.images)

    def cancel(self) -> None:
        """Ask the scheduler to drop this request at the next step (thread-safe: a flag)."""
        self.cancel_requested = True

    def chunk(self, start: int = 0) -> Chunk:
        """The generated tokens from `start` on, with what the request asked to get with them."""
        return Chunk(
            self.generated[start:],
            self.logprobs[start:] if self.return_log_probs else None,
            self.top[start:] if self.top_logprobs else None,
        )

    def banned_tokens(self) -> list[int]:
        """Tokens that must not be produced next: bad words whose prefix matches the tail, and
        end_id while fewer than min_tokens tokens were produced."""
        banned: list[int] = []
        if self.bad_words:
            seq = self.generated
            for word in self.bad_words:
                n = len(word) - 1
                if n == 0:
                    banned.append(word[0])
                    continue
                tail = _tail(self.prompt, seq, n)
                if tail == word[:-1]:
                    banned.append(word[-1])
        if self.end_id is not None and len(self.generated) < self.min_tokens:
            banned.append(self.end_id)
        return banned

    def stop_word_matched(self) -> bool:
        """Whether prompt+generated ends with one of the stop sequences (checked after each token)."""
        last = self.generated[-1]
        for word in self.stop_words:
            if word[-1] == last and _tail(self.prompt, self.generated, len(word)) == word:
                return True
        return False


def _tail(prompt: list[int], generated: list[int], n: int) -> list[int]:
    """Last n ids of prompt+generated without concatenating the whole sequence."""
    if n <= len(generated):
        return generated[len(generated) - n :]
    missing = n - len(generated)
    return prompt[max(0, len(prompt) - missing) :] + generated


def parse_word_list(ids: Sequence[int], offsets: Sequence[int]) -> list[list[int]]:
    """Decode TensorRT-LLM's [2, L] word-list layout (ids row, cumulative end offsets row padded
    with -1) into a list of token sequences; empty words are dropped."""
    words: list[list[int]] = []
    start = 0
    for end in offsets:
        end = int(end)
        if end < 0:
            break
        if end > len(ids) or end < start:
            raise ValueError(f"invalid word-list offset {end}")
        word = [int(t) for t in ids[start:end]]
        if word:
            words.append(word)
        start = end
    return words
