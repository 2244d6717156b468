"""Scheduler semantics with the synthetic backend (no Triton): counts, end ids, stop words,
bans, min_tokens, cancellation, joining between steps and queueing."""

from __future__ import annotations

import time

import pytest
from cpu_engine_helpers import EOS, VOCAB, make_request

from tensorrtllm_backend.python_models.cpu_engine.request import FinishReason, parse_word_list
from tensorrtllm_backend.python_models.cpu_engine.synthetic import (
    FIRST_ID,
    predict_tokens,
)

PROMPT = [5, 17, 300, 42]


def wait_all(*sinks, timeout: float = 5.0) -> None:
    for sink in sinks:
        assert sink.done.wait(timeout), "request did not finish"


def test_exact_token_count_streaming_and_final_flag(make_scheduler):
    scheduler = make_scheduler()
    req, sink = make_request(PROMPT, 7, streaming=True)
    scheduler.submit(req)
    wait_all(sink)
    assert sink.reason is FinishReason.LENGTH
    assert len(sink.chunks) == 7
    assert all(len(tokens) == 1 for tokens, _, _ in sink.chunks)
    assert [final for _, _, final in sink.chunks] == [False] * 6 + [True]
    assert sink.streamed() == predict_tokens(PROMPT, 7, vocab_size=VOCAB, eos_token_id=EOS)
    assert req.generated == sink.streamed()


def test_non_streaming_gets_no_chunks_only_finish(make_scheduler):
    scheduler = make_scheduler()
    req, sink = make_request(PROMPT, 5)
    scheduler.submit(req)
    wait_all(sink)
    assert sink.chunks == []
    assert sink.reason is FinishReason.LENGTH
    assert len(req.generated) == 5


def test_tokens_avoid_special_ids_and_engine_eos():
    tokens = predict_tokens(list(range(50)), 2000, vocab_size=VOCAB, eos_token_id=700)
    assert min(tokens) >= FIRST_ID
    assert 700 not in tokens
    assert max(tokens) < VOCAB


def test_end_id_stops_without_returning_it(make_scheduler):
    scheduler = make_scheduler()
    expected = predict_tokens(PROMPT, 5, vocab_size=VOCAB, eos_token_id=EOS)
    req, sink = make_request(PROMPT, 10, streaming=True, end_id=expected[2])
    scheduler.submit(req)
    wait_all(sink)
    assert sink.reason is FinishReason.END_ID
    assert req.generated == expected[:2]
    assert sink.streamed() == expected[:2]
    assert sink.chunks[-1] == ([], None, True)  # the final flag rides an empty response


def test_min_tokens_suppresses_end_id(make_scheduler):
    scheduler = make_scheduler()
    expected = predict_tokens(PROMPT, 5, vocab_size=VOCAB, eos_token_id=EOS)
    req, sink = make_request(PROMPT, 6, end_id=expected[0], min_tokens=3)
    scheduler.submit(req)
    wait_all(sink)
    assert expected[0] not in req.generated[:3]
    assert len(req.generated) >= 3
    assert req.generated[1:3] == expected[1:3]


def test_stop_words_match_on_ids_and_are_included(make_scheduler):
    scheduler = make_scheduler()
    expected = predict_tokens(PROMPT, 8, vocab_size=VOCAB, eos_token_id=EOS)
    stop_words = parse_word_list([999, 998, expected[2], expected[3]], [2, 4])
    assert stop_words == [[999, 998], [expected[2], expected[3]]]
    req, sink = make_request(PROMPT, 8, streaming=True, stop_words=stop_words)
    scheduler.submit(req)
    wait_all(sink)
    assert sink.reason is FinishReason.STOP_WORDS
    assert req.generated == expected[:4]
    assert sink.chunks[-1] == ([expected[3]], None, True)


def test_bad_words_single_and_multi_token(make_scheduler):
    scheduler = make_scheduler()
    expected = predict_tokens(PROMPT, 4, vocab_size=VOCAB, eos_token_id=EOS)
    req, sink = make_request(PROMPT, 4, bad_words=[[expected[0]]])
    scheduler.submit(req)
    wait_all(sink)
    assert req.generated[0] != expected[0]
    # Multi-token: ban the last token only when the prefix matches the tail of the sequence.
    req2, sink2 = make_request(PROMPT, 4, bad_words=[[PROMPT[-1], expected[0]], [1, expected[1]]])
    scheduler.submit(req2)
    wait_all(sink2)
    assert req2.generated[0] != expected[0]


def test_word_list_padding_and_offsets():
    assert parse_word_list([5, 6, 7, 0], [2, 3, -1, -1]) == [[5, 6], [7]]
    assert parse_word_list([], []) == []
    with pytest.raises(ValueError):
        parse_word_list([5], [3])


def test_log_probs_are_zero_for_synthetic(make_scheduler):
    scheduler = make_scheduler()
    req, sink = make_request(PROMPT, 3, streaming=True, return_log_probs=True)
    scheduler.submit(req)
    wait_all(sink)
    assert [lp for _, lp, _ in sink.chunks] == [[0.0], [0.0], [0.0]]
    assert req.cum_logprob == 0.0


def test_synthetic_alternatives_are_the_chosen_token_then_impossible_ones(make_scheduler):
    scheduler = make_scheduler()
    req, sink = make_request(PROMPT, 3, streaming=True, return_log_probs=True, top_logprobs=3)
    scheduler.submit(req)
    wait_all(sink)
    tops = [entry for chunk in sink.tops for entry in chunk]
    assert len(tops) == 3
    for token, (ids, values) in zip(req.generated, tops, strict=True):
        assert ids[0] == token and len(set(ids)) == 3
        assert values == [0.0, float("-inf"), float("-inf")]
        assert all(FIRST_ID <= i < VOCAB for i in ids)
    assert req.top == tops  # kept for non-streaming answers too


@pytest.mark.parametrize(("interval", "tokens"), [(1, 7), (3, 7), (3, 10), (5, 3)])
def test_stream_interval_sends_the_first_token_then_groups(make_scheduler, interval, tokens):
    scheduler = make_scheduler(stream_interval=interval)
    req, sink = make_request(PROMPT, tokens, streaming=True, return_log_probs=True)
    scheduler.submit(req)
    wait_all(sink)
    sizes = [len(chunk) for chunk, _, _ in sink.chunks]
    rest = tokens - 1
    assert sizes == [1] + [interval] * (rest // interval) + (
        [rest % interval] if rest % interval else []
    )
    assert [final for _, _, final in sink.chunks][-1] is True
    assert sink.streamed() == predict_tokens(PROMPT, tokens, vocab_size=VOCAB, eos_token_id=EOS)
    assert [lp for _, lps, _ in sink.chunks for lp in lps] == [0.0] * tokens


def test_stream_interval_flushes_at_the_end_token(make_scheduler):
    expected = predict_tokens(PROMPT, 6, vocab_size=VOCAB, eos_token_id=EOS)
    scheduler = make_scheduler(stream_interval=4)
    req, sink = make_request(PROMPT, 20, streaming=True, end_id=expected[3])
    scheduler.submit(req)
    wait_all(sink)
    assert sink.chunks == [([expected[0]], None, False), (expected[1:3], None, True)]


def test_stream_interval_sends_held_tokens_before_a_cancel(make_scheduler):
    scheduler = make_scheduler(stream_interval=100, itl_ms=5)
    req, sink = make_request(PROMPT, 1000, streaming=True, request_id="r1")
    scheduler.submit(req)
    assert sink.first_token.wait(5)
    deadline = time.monotonic() + 5
    while len(req.generated) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    scheduler.cancel("r1")
    wait_all(sink)
    assert sink.reason is FinishReason.CANCELLED
    assert sink.streamed() == req.generated


def test_seed_changes_sequence(make_scheduler):
    scheduler = make_scheduler()
    from tensorrtllm_backend.python_models.cpu_engine.request import SamplingParams

    a, sa = make_request(PROMPT, 6)
    b, sb = make_request(PROMPT, 6, sampling=SamplingParams(seed=11))
    scheduler.submit(a)
    scheduler.submit(b)
    wait_all(sa, sb)
    assert a.generated != b.generated
    assert b.generated == predict_tokens(PROMPT, 6, vocab_size=VOCAB, eos_token_id=EOS, seed=11)


def test_cancellation_frees_slot_within_one_step(make_scheduler):
    scheduler = make_scheduler(max_batch_size=1, itl_ms=20)
    long_req, long_sink = make_request(PROMPT, 1000, streaming=True)
    waiting, waiting_sink = make_request(PROMPT, 2, streaming=True)
    scheduler.submit(long_req)
    scheduler.submit(waiting)
    assert long_sink.first_token.wait(5)
    assert scheduler.stats().queued == 1
    long_sink.cancelled = True
    # Counted after the flag is set, so that a delay of this thread cannot add steps.
    generated_at_cancel = len(long_req.generated)
    assert long_sink.done.wait(5)
    assert long_sink.reason is FinishReason.CANCELLED
    # Dropped at the next pass: at most the step already running adds a token.
    assert len(long_req.generated) <= generated_at_cancel + 1
    assert waiting_sink.first_token.wait(5)
    wait_all(waiting_sink)
    assert len(long_req.generated) < 1000
    assert scheduler.stats().cancelled == 1


def test_cancel_by_request_id(make_scheduler):
    scheduler = make_scheduler(itl_ms=5)
    req, sink = make_request(PROMPT, 1000, streaming=True, request_id="abc")
    scheduler.submit(req)
    assert sink.first_token.wait(2)
    assert scheduler.cancel("abc") == 1
    wait_all(sink)
    assert sink.reason is FinishReason.CANCELLED
    assert scheduler.cancel("abc") == 0


def test_requests_join_between_steps(make_scheduler):
    scheduler = make_scheduler(itl_ms=10)
    # 10 s of tokens: still running when the second one ends, however slow this machine is.
    first, first_sink = make_request(PROMPT, 1000, streaming=True, request_id="first")
    scheduler.submit(first)
    assert first_sink.first_token.wait(2)
    second, second_sink = make_request([9, 9, 9], 3, streaming=True)
    scheduler.submit(second)
    wait_all(second_sink)
    # The second request finished while the first was still running: it joined mid-flight.
    assert not first_sink.done.is_set()
    assert second.generated == predict_tokens([9, 9, 9], 3, vocab_size=VOCAB, eos_token_id=EOS)
    scheduler.cancel("first")
    wait_all(first_sink)
    # The join did not disturb the first request: its tokens are its own, in order.
    assert 0 < len(first.generated) < 1000
    assert first_sink.streamed() == first.generated
    assert first.generated == predict_tokens(
        PROMPT, len(first.generated), vocab_size=VOCAB, eos_token_id=EOS
    )


def test_queueing_beyond_max_batch_size(make_scheduler):
    scheduler = make_scheduler(max_batch_size=4, itl_ms=5)
    pairs = [make_request([i + 3, 7], 10, streaming=True) for i in range(10)]
    for req, _ in pairs:
        scheduler.submit(req)
    stats = scheduler.stats()  # holds at any moment: queued counts what was not admitted yet
    assert stats.active <= 4
    assert stats.active + stats.queued + stats.finished == 10
    wait_all(*[sink for _, sink in pairs])
    assert all(len(req.generated) == 10 for req, _ in pairs)
    stats = scheduler.stats()
    assert (stats.active, stats.queued, stats.finished, stats.generated_tokens) == (0, 0, 10, 100)


def test_many_streams_at_zero_itl(make_scheduler):
    scheduler = make_scheduler()
    pairs = [make_request([i + 3], 50, streaming=True) for i in range(128)]
    for req, _ in pairs:
        scheduler.submit(req)
    wait_all(*[sink for _, sink in pairs])
    # Every stream gets each of its tokens once, in order (how fast is a benchmark's question).
    for req, sink in pairs:
        assert sink.streamed() == req.generated and len(req.generated) == 50


def test_ttft_and_itl_delays(make_scheduler):
    scheduler = make_scheduler(ttft_ms=100, itl_ms=20)
    req, sink = make_request(PROMPT, 6, streaming=True)
    start = time.monotonic()
    scheduler.submit(req)
    assert sink.first_token.wait(2)
    ttft = time.monotonic() - start
    wait_all(sink)
    total = time.monotonic() - start
    # The delays are floors; how far above them a loaded machine lands is not this test's business.
    assert ttft >= 0.09
    assert total >= 0.09 + 5 * 0.02 - 0.01


def test_backend_error_fails_only_that_request(make_scheduler):
    scheduler = make_scheduler()
    bad, bad_sink = make_request([VOCAB + 5], 3)
    good, good_sink = make_request(PROMPT, 3)
    scheduler.submit(bad)
    scheduler.submit(good)
    wait_all(bad_sink, good_sink)
    assert bad_sink.error is not None and "vocabulary" in bad_sink.error
    assert good_sink.reason is FinishReason.LENGTH
    assert scheduler.stats().failed == 1


def test_stop_cancels_in_flight_requests(make_scheduler):
    scheduler = make_scheduler(itl_ms=50)
    req, sink = make_request(PROMPT, 1000, streaming=True)
    scheduler.submit(req)
    assert sink.first_token.wait(2)
    scheduler.stop()
    assert sink.done.is_set()
    assert sink.reason is FinishReason.CANCELLED


def test_synthetic_context_logits_follow_the_documented_formula():
    from tensorrtllm_backend.python_models.cpu_engine.synthetic import context_logits

    prompt = [5, 9, 5]
    logits = context_logits(prompt, 40)
    assert logits.shape == (3, 40) and logits.dtype.name == "float32"
    assert (logits[0] == logits[2]).all()  # a function of the token alone
    assert logits[1, 7] == pytest.approx(-((7 * 7919 + 9 * 104729) % 1000) / 100)


def test_the_synthetic_engine_models_a_prefix_cache(make_scheduler):
    """Bookkeeping only: a request that shares an earlier one's full blocks reports them as
    reused (the last prompt token always computed), and the tokens do not change."""
    from tensorrtllm_backend.python_models.cpu_engine.block_cache import BlockTable
    from tensorrtllm_backend.python_models.kv_events import BlockStored

    events: list = []
    sched = make_scheduler(reuse=BlockTable(4, 64, events.extend))
    shared = list(range(10, 26))  # four blocks of four
    first, first_sink = make_request(shared + [30, 31], 3)
    sched.submit(first)
    wait_all(first_sink)
    second, second_sink = make_request(shared + [40, 41, 42, 43], 3)
    sched.submit(second)
    wait_all(second_sink)
    assert (second.reused_blocks, second.cached_tokens) == (4, 16)
    assert first.cached_tokens == 0
    stored = [event for event in events if isinstance(event, BlockStored)]
    # The first request's full blocks: its 18 prompt tokens and 2 of its 3 generated (fed).
    assert stored[0].token_ids == shared + [30, 31, *first.generated[:2]]
    plain = make_scheduler()
    again, again_sink = make_request(shared + [40, 41, 42, 43], 3)
    plain.submit(again)
    wait_all(again_sink)
    assert again.generated == second.generated
