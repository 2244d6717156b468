"""hf backend on the demo checkpoint: greedy equals transformers generate(), batched prefill and
decode equal unbatched, seeded sampling is reproducible, log probs are real; demo tokenizer round-trips."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from cpu_engine_helpers import make_request, make_sequences, run_to_end

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

from tensorrtllm_backend.packing.demo import build_demo_checkpoint  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.hf import HFBackend  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.request import SamplingParams  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler  # noqa: E402

PROMPTS = [
    "The lighthouse keeper woke before dawn",
    "Hello",
    "Serving a model to many users at once is a problem of scheduling, and",
    "Le café était presque vide. 今日は",
]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def backend(demo_checkpoint):
    return HFBackend(demo_checkpoint, num_threads=1, device="cpu")  # GPU hosts too: CPU figures


@pytest.fixture
def scheduler(backend):
    sched = Scheduler(backend, max_batch_size=8)
    sched.start()
    yield sched
    sched.stop()


def encode(tokenizer, text):
    return tokenizer(text)["input_ids"]


def reference_greedy(model, prompt, n):
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
        max_new_tokens=n,
        min_new_tokens=n,  # never stop early: the engine runs without end_id here
        do_sample=False,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def test_greedy_matches_transformers_generate(scheduler, backend, demo_tokenizer):
    prompts = [encode(demo_tokenizer, p) for p in PROMPTS]
    # min_new_tokens bans eos in the reference; end_id + min_tokens do the same in the engine.
    reqs = [make_request(p, NEW_TOKENS, end_id=2, min_tokens=NEW_TOKENS) for p in prompts]
    got = run_to_end(scheduler, reqs)  # all four decode together: batched, left-padded caches
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == reference_greedy(backend.model, prompt, NEW_TOKENS)


def test_batched_decode_equals_unbatched(scheduler, demo_tokenizer):
    prompts = [encode(demo_tokenizer, p) for p in PROMPTS]
    alone = []
    for p in prompts:
        alone.extend(run_to_end(scheduler, [make_request(p, NEW_TOKENS)]))
    together = run_to_end(scheduler, [make_request(p, NEW_TOKENS) for p in prompts])
    assert together == alone


@dataclass
class Step:
    decoding: int  # requests that fed their last token
    prompts: list[int]  # the prompt length of each request that joined
    forwards: list[tuple[int, ...]]  # the input shape of each model forward the step ran


@pytest.fixture
def steps(backend, monkeypatch):
    """Every step from now on: who was in it, and the model forwards it ran."""
    recorded: list[Step] = []
    shapes: list[tuple[int, ...]] = []
    forward = backend._forward

    def recording_forward(active, joining):
        shapes.clear()
        logits = forward(active, joining)
        prompts = [len(req.prompt) for req in joining]
        recorded.append(Step(len(active) - len(joining), prompts, list(shapes)))
        return logits

    monkeypatch.setattr(backend, "_forward", recording_forward)
    hook = backend.model.register_forward_pre_hook(
        lambda _m, _a, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    yield recorded
    hook.remove()


def test_requests_joining_together_share_one_forward(scheduler, demo_tokenizer, steps):
    prompts = [encode(demo_tokenizer, p) for p in PROMPTS]
    alone = [run_to_end(scheduler, [make_request(p, NEW_TOKENS)])[0] for p in prompts]
    steps.clear()
    together = run_to_end(scheduler, [make_request(p, NEW_TOKENS) for p in prompts])
    assert together == alone
    lengths = [len(p) for p in prompts]
    # The prompts packed one after the other in one row: no padding to the longest.
    assert steps[0] == Step(0, lengths, [(1, sum(lengths))])
    assert all(step == Step(len(prompts), [], [(1, len(prompts))]) for step in steps[1:])


def test_staggered_joins_run_in_the_decode_forward_and_equal_unbatched(
    scheduler, demo_tokenizer, steps
):
    prompts = [encode(demo_tokenizer, p * 3) for p in PROMPTS] * 2
    new_tokens = 40
    alone = [run_to_end(scheduler, [make_request(p, new_tokens)])[0] for p in prompts]
    steps.clear()
    reqs = [make_request(p, new_tokens, streaming=True) for p in prompts]
    for req, sink in reqs:  # each joins once the previous one produced a token
        scheduler.submit(req)
        assert sink.first_token.wait(30)
    for _, sink in reqs:
        assert sink.done.wait(30)
    assert [req.generated for req, _ in reqs] == alone
    # One forward per step, as wide as its tokens: the rows decoding feed one token each,
    # whoever joins its prompt, nobody pads to anybody else's width.
    assert all(step.forwards == [(1, step.decoding + sum(step.prompts))] for step in steps)
    mixed = [step for step in steps if step.decoding and step.prompts]
    assert len(mixed) == len(prompts) - 1


def test_same_seed_same_sample(scheduler, demo_tokenizer):
    prompt = encode(demo_tokenizer, PROMPTS[0])

    def sampled(seed):
        params = SamplingParams(temperature=1.5, top_k=50, top_p=0.95, seed=seed)
        return run_to_end(scheduler, [make_request(prompt, 16, sampling=params)])[0]

    first = sampled(7)
    assert sampled(7) == first
    assert any(sampled(seed) != first for seed in (8, 9, 10))
    greedy = run_to_end(scheduler, [make_request(prompt, 16)])[0]
    assert first != greedy


def test_log_probs_are_real(scheduler, backend, demo_tokenizer):
    prompt = encode(demo_tokenizer, PROMPTS[1])
    req, sink = make_request(prompt, 4, return_log_probs=True)
    run_to_end(scheduler, [(req, sink)])
    with torch.inference_mode():
        ids = torch.tensor([prompt + req.generated])
        logprobs = torch.log_softmax(backend.model(ids).logits[0], dim=-1)
    expected = [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(req.generated)]
    assert req.logprobs == pytest.approx(expected, abs=1e-4)
    assert req.cum_logprob == pytest.approx(sum(expected), abs=1e-3)
    assert all(lp < 0 for lp in req.logprobs)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, top_k=5)])
def test_top_logprobs_are_the_distributions_most_likely_tokens(
    scheduler, backend, demo_tokenizer, sampling
):
    prompt = encode(demo_tokenizer, PROMPTS[0])
    req, sink = make_request(
        prompt, 5, return_log_probs=True, top_logprobs=4, sampling=sampling, streaming=True
    )
    run_to_end(scheduler, [(req, sink)])
    with torch.inference_mode():
        ids = torch.tensor([prompt + req.generated])
        logits = backend.model(ids).logits[0].float() / (sampling.temperature or 1.0)
        logprobs = torch.log_softmax(logits, dim=-1)
    assert [entry for chunk in sink.tops for entry in chunk] == req.top
    for position, (token, (top_ids, top_values)) in enumerate(
        zip(req.generated, req.top, strict=True)
    ):
        row = logprobs[len(prompt) - 1 + position]
        values, expected_ids = torch.topk(row, 4)
        assert top_ids == expected_ids.tolist()
        assert top_values == pytest.approx(values.tolist(), abs=1e-4)
        assert top_values == sorted(top_values, reverse=True)
        assert req.logprobs[position] == pytest.approx(float(row[token]), abs=1e-4)
        if sampling.greedy:
            assert top_ids[0] == token


def test_penalties_and_bans_change_greedy_output(scheduler, demo_tokenizer):
    prompt = encode(demo_tokenizer, PROMPTS[2])
    base = run_to_end(scheduler, [make_request(prompt, 8)])[0]
    banned = run_to_end(scheduler, [make_request(prompt, 8, bad_words=[[base[0]]])])[0]
    assert banned[0] != base[0]
    end = run_to_end(scheduler, [make_request(prompt, 8, end_id=base[3])])[0]
    assert end == base[: base.index(base[3])]
    penalized = run_to_end(
        scheduler,
        [make_request(prompt, 8, sampling=SamplingParams(repetition_penalty=5.0))],
    )[0]
    assert len(set(penalized)) >= len(set(base))


def test_demo_tokenizer_round_trips_multibyte(demo_tokenizer):
    texts = ["Héllo wörld", "你好，世界", "🚀🇫🇷👍🏽 ok", "crème brûlée ∞ ≈ €", "Привет"]
    for text in texts:
        ids = demo_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert demo_tokenizer.decode(ids) == text
    ids = demo_tokenizer("hi")["input_ids"]
    assert ids[0] == demo_tokenizer.bos_token_id == 1
    assert demo_tokenizer.eos_token_id == 2 and demo_tokenizer.pad_token_id == 0
    assert len(demo_tokenizer) == 2048
    chat = demo_tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert chat == "<|system|>\nS</s>\n<|user|>\nU</s>\n<|assistant|>\n"


def test_demo_checkpoint_is_deterministic(demo_checkpoint, tmp_path):
    again = build_demo_checkpoint(tmp_path / "again")
    for name in ("tokenizer.json", "config.json", "model.safetensors"):
        assert (again / name).read_bytes() == (demo_checkpoint / name).read_bytes()


def test_return_sequences_sample_with_seed_plus_index(scheduler, demo_tokenizer):
    """num_return_sequences: sequence i samples like a lone request with seed + i, so the N
    sequences differ from each other yet the same request gives the same N sequences again."""
    prompt = encode(demo_tokenizer, PROMPTS[0])
    params = SamplingParams(temperature=1.5, top_k=50, top_p=0.95, seed=7)

    def sequences():
        return run_to_end(scheduler, make_sequences(prompt, 16, 3, sampling=params))

    first = sequences()  # the three decode together in one batch
    assert sequences() == first
    assert len({tuple(tokens) for tokens in first}) == 3
    for i, tokens in enumerate(first):
        alone = SamplingParams(temperature=1.5, top_k=50, top_p=0.95, seed=7 + i)
        assert run_to_end(scheduler, [make_request(prompt, 16, sampling=alone)])[0] == tokens


def test_return_sequences_greedy_are_identical(scheduler, demo_tokenizer):
    """Greedy ignores the seed: N greedy sequences are the same, as on TensorRT-LLM."""
    prompt = encode(demo_tokenizer, PROMPTS[2])
    got = run_to_end(scheduler, make_sequences(prompt, 10, 3, sampling=SamplingParams(seed=4)))
    assert got[0] == got[1] == got[2] == run_to_end(scheduler, [make_request(prompt, 10)])[0]


def test_sliding_window_attention_equals_transformers_generate(tmp_path):
    """A model whose attention sees only the last few positions (Mistral's sliding window):
    packed steps, joiners beside decoding rows, give what transformers' generate() gives."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        sliding_window=3,
    )  # fmt: skip
    torch.manual_seed(0)
    MistralForCausalLM(config).save_pretrained(tmp_path)
    backend = HFBackend(tmp_path, num_threads=1, device="cpu")
    prompts = [[5, 9, 17, 33, 2, 71, 8], [40, 41], [3, 90, 91, 92, 93, 94, 95, 96, 12, 13]]
    sched = Scheduler(backend, max_batch_size=4)
    sched.start()
    try:
        reqs = [make_request(p, 12, streaming=True) for p in prompts]
        for req, sink in reqs:  # each joins while the ones before it decode
            sched.submit(req)
            assert sink.first_token.wait(30)
        for _, sink in reqs:
            assert sink.done.wait(30) and sink.error is None
    finally:
        sched.stop()
    for prompt, (req, _) in zip(prompts, reqs, strict=True):
        assert req.generated == reference_greedy(backend.model, prompt, 12)


def test_context_logits_are_the_prompts_logits_in_a_joint_step(scheduler, backend, demo_tokenizer):
    """A request that asks for its prompt's logits gets every position's, also when it joins
    the step beside others that do not; the others' tokens are unchanged."""
    scored = encode(demo_tokenizer, PROMPTS[2])
    plain = encode(demo_tokenizer, PROMPTS[0])
    req, sink = make_request(scored, 2, context_logits=True)
    other, other_sink = make_request(plain, 3)
    run_to_end(scheduler, [(other, other_sink), (req, sink)])
    with torch.inference_mode():
        expected = backend.model(torch.tensor([scored])).logits[0].float()
    assert req.prompt_logits.shape == (len(scored), backend.vocab_size)
    assert torch.allclose(torch.from_numpy(req.prompt_logits), expected, atol=1e-4)
    assert other.prompt_logits is None
    assert other.generated == reference_greedy(backend.model, plain, 3)


def test_a_shared_prefix_is_reused_and_changes_no_token(demo_checkpoint, demo_tokenizer):
    """With the prefix cache, a second request sharing a prompt's blocks skips their prefill:
    its forward feeds only the rest, reports the reused tokens, and generates what it would
    without the cache."""
    from tensorrtllm_backend.python_models.cpu_engine.block_cache import BlockTable

    events: list = []
    backend = HFBackend(
        demo_checkpoint, num_threads=1, device="cpu", reuse=BlockTable(8, 64, events.extend)
    )
    sched = Scheduler(backend, max_batch_size=8)
    sched.start()
    try:
        shared = encode(demo_tokenizer, PROMPTS[2] * 2)
        first = shared + encode(demo_tokenizer, " first")[1:]
        second = shared + encode(demo_tokenizer, " and a second ending")[1:]
        fed: list[int] = []
        hook = backend.model.register_forward_pre_hook(
            lambda _m, _a, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True
        )
        run_to_end(sched, [make_request(first, 4)])
        fed.clear()
        req, sink = make_request(second, 6)
        (generated,) = run_to_end(sched, [(req, sink)])
        hook.remove()
    finally:
        sched.stop()
    reused = len(shared) // 8 * 8
    assert req.cached_tokens == reused and req.reused_blocks == reused // 8
    assert fed[0] == len(second) - reused  # the prefill fed only the tokens past the prefix
    assert generated == reference_greedy(backend.model, second, 6)
    stored = [event for event in events if type(event).__name__ == "BlockStored"]
    assert stored and stored[0].block_size == 8
