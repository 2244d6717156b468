"""num_return_sequences in the CPU engine (no Triton): one row becomes N GenRequests with
sequence_index 0..N-1 and seed + i, each in its own batch slot; cancellation by request id
drops all N. Sampling with real logits is covered in test_cpu_engine_hf.py."""

from __future__ import annotations

from cpu_engine_helpers import EOS, VOCAB, make_sequences

from tensorrtllm_backend.python_models.cpu_engine.request import FinishReason, SamplingParams
from tensorrtllm_backend.python_models.cpu_engine.synthetic import predict_tokens
from tensorrtllm_backend.python_models.cpu_engine.triton_io import split_sequences

PROMPT = [5, 17, 300, 42]


def test_split_gives_sequence_indexes_and_consecutive_seeds():
    sampling = SamplingParams(temperature=0.8, top_k=40, seed=100)
    row = {"prompt": PROMPT, "batch_index": 3, "sequence_index": 0, "sampling": sampling}
    sequences = split_sequences(row, 4)
    assert [s["sequence_index"] for s in sequences] == [0, 1, 2, 3]
    assert [s["sampling"].seed for s in sequences] == [100, 101, 102, 103]
    assert all(s["batch_index"] == 3 and s["prompt"] == PROMPT for s in sequences)
    # Everything but the seed is the row's; the row's own SamplingParams is not modified.
    assert all(s["sampling"].top_k == 40 and s["sampling"].temperature == 0.8 for s in sequences)
    assert sampling.seed == 100
    assert split_sequences(row, 1) == [row]


def test_n_sequences_each_complete_with_seed_plus_index(make_scheduler):
    scheduler = make_scheduler()
    pairs = make_sequences(PROMPT, 9, 3, streaming=True, sampling=SamplingParams(seed=5))
    for req, _ in pairs:
        scheduler.submit(req)
    for req, sink in pairs:
        assert sink.done.wait(5)
        assert sink.reason is FinishReason.LENGTH
        expected = predict_tokens(
            PROMPT, 9, vocab_size=VOCAB, eos_token_id=EOS, seed=5 + req.sequence_index
        )
        assert sink.streamed() == req.generated == expected
        assert [final for _, _, final in sink.chunks] == [False] * 8 + [True]
    assert len({tuple(req.generated) for req, _ in pairs}) == 3
    stats = scheduler.stats()
    assert (stats.finished, stats.generated_tokens) == (3, 27)


def test_sequences_take_batch_slots_and_queue(make_scheduler):
    # 5 s of tokens each: the first two hold their slots while this test looks, however slow
    # this machine is; each ends when its client leaves.
    scheduler = make_scheduler(max_batch_size=2, itl_ms=5)
    pairs = make_sequences(PROMPT, 1000, 3, streaming=True)
    for req, _ in pairs:
        scheduler.submit(req)
    (_, first_sink), (_, second_sink), (third, third_sink) = pairs
    assert first_sink.first_token.wait(2) and second_sink.first_token.wait(2)
    stats = scheduler.stats()
    assert (stats.active, stats.queued) == (2, 1)  # each sequence is its own batch entry
    assert third.generated == []
    first_sink.cancelled = second_sink.cancelled = True
    assert first_sink.done.wait(5) and second_sink.done.wait(5)
    assert third_sink.first_token.wait(5)  # a slot came free: the queued sequence runs
    stats = scheduler.stats()
    assert (stats.active, stats.queued) == (1, 0)
    third_sink.cancelled = True
    for req, sink in pairs:
        assert sink.done.wait(5)
        assert sink.reason is FinishReason.CANCELLED
        assert sink.streamed() == req.generated and 0 < len(req.generated) < 1000


def test_cancel_by_request_id_drops_all_sequences(make_scheduler):
    # Two slots for three sequences: the cancel reaches running and queued sequences alike.
    scheduler = make_scheduler(max_batch_size=2, itl_ms=5)
    pairs = make_sequences(PROMPT, 1000, 3, streaming=True, request_id="multi")
    for req, _ in pairs:
        scheduler.submit(req)
    assert pairs[0][1].first_token.wait(2) and pairs[1][1].first_token.wait(2)
    assert scheduler.cancel("multi") == 3
    for req, sink in pairs:
        assert sink.done.wait(2)
        assert sink.reason is FinishReason.CANCELLED
        assert len(req.generated) < 1000
    assert pairs[2][0].generated == []  # cancelled while still queued
    stats = scheduler.stats()
    assert (stats.active, stats.queued, stats.cancelled) == (0, 0, 3)
    assert scheduler.cancel("multi") == 0


def test_client_gone_drops_all_sequences(make_scheduler):
    """Sequences of one Triton request share its response group, so they see the client leave
    together (simulated: every sink reports cancelled)."""
    scheduler = make_scheduler(itl_ms=5)
    pairs = make_sequences(PROMPT, 1000, 4, streaming=True)
    for req, _ in pairs:
        scheduler.submit(req)
    assert all(sink.first_token.wait(2) for _, sink in pairs)
    for _, sink in pairs:
        sink.cancelled = True
    for _, sink in pairs:
        assert sink.done.wait(2)
        assert sink.reason is FinishReason.CANCELLED
    assert scheduler.stats().cancelled == 4
