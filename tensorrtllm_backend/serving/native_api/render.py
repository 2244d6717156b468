"""The native whole answer (`/generate_text`): the core's answer steps collected
(:func:`~..chat.stream.collect`), rendered once as a :class:`GenerateResponse`. `/generate`
streams the generator's text as it is."""

from __future__ import annotations

from ..chat.stream import SequenceAnswer, WholeAnswer
from ..generation import PreparedRequest
from ..schemas import FinishReason, GeneratedSequence, GenerateResponse, TopLogProb, Usage
from ..token_strings import TokenStrings


def native_response(
    prepared: PreparedRequest, answer: WholeAnswer, token_strings: TokenStrings
) -> GenerateResponse:
    """The answer; every sequence listed when there are several. `token_strings` gives the text
    of token ids (for the alternatives)."""
    params = prepared.params
    want, top = params.return_log_probs, bool(params.top_log_probs)
    sequences = [
        GeneratedSequence(
            index=sequence.index,
            text=sequence.text,
            finish_reason=sequence.finish_reason or FinishReason.STOP,
            completion_tokens=sequence.token_count,
            log_probs=sequence.log_probs if want else None,
            cum_log_prob=sequence.cum_log_prob if want else None,
            top_log_probs=_alternatives(sequence, token_strings) if top else None,
        )
        for sequence in answer.sequences
    ]
    first = sequences[0]
    usage = answer.usage
    return GenerateResponse(
        text=first.text,
        finish_reason=first.finish_reason,
        usage=Usage(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
        ),
        log_probs=first.log_probs,
        cum_log_prob=first.cum_log_prob,
        top_log_probs=first.top_log_probs,
        sequences=sequences if len(sequences) > 1 else None,
    )


def _alternatives(sequence: SequenceAnswer, token_strings: TokenStrings) -> list[list[TopLogProb]]:
    """The alternatives with their text (every token decoded in one call)."""
    texts = iter(token_strings([i for ids, _ in sequence.top_log_probs for i in ids]))
    return [
        [
            TopLogProb(token_id=i, token=next(texts), log_prob=lp)
            for i, lp in zip(ids, lps, strict=True)
        ]
        for ids, lps in sequence.top_log_probs
    ]
