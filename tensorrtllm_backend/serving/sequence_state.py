"""Per-sequence state of a generation stream: its decoder, stop strings and token count."""

from __future__ import annotations

from ..common.tokenization import StopStringMatcher
from .schemas import FinishReason, GenerationChunk
from .triton_paths import Decoder


class SequenceState:
    """Per-sequence state of a stream: its decoder, stop strings and token count."""

    __slots__ = ("index", "decode", "stops", "generated", "finish_reason")

    def __init__(self, index: int, decode: Decoder, stops: StopStringMatcher) -> None:
        self.index = index
        self.decode = decode
        self.stops = stops
        self.generated = 0
        self.finish_reason = FinishReason.STOP

    @property
    def stopped(self) -> bool:
        """Cut at a stop string (the matcher suppresses everything after it)."""
        return self.stops.stopped

    def last_chunk(self, max_tokens: int) -> GenerationChunk:
        """Text held back for a possible stop string, with the finish reason."""
        tail = ""
        if not self.stopped:
            # The text before a stop string completed by the flushed bytes is still output.
            tail, stopped = self.stops.feed(self.decode.flush())
            if not stopped:
                tail += self.stops.flush()
        count, reason = self.decode.finish(max_tokens, self.generated)
        if not self.stopped and reason is not None:
            self.finish_reason = reason
        return GenerationChunk(
            tail,
            token_count=count,
            finish_reason=self.finish_reason,
            index=self.index,
            stop=self.stops.matched,
        )
