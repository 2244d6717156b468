"""hf backend on the demo Qwen2-VL and Qwen2.5-VL: their images reach the model as transformers
runs it, and so do their multimodal rotary positions (M-RoPE: 3-D for image tokens, text after
an image going on from the image grid's largest position, generated tokens at length + rope
delta), in packed steps beside text-only requests and requests that decode, and past a reused
prefix. The judge is transformers' own generate() with the processor's tensors."""

from __future__ import annotations

import os

import pytest
from cpu_engine_helpers import make_request, run_on
from vlm_engine_helpers import (
    QUESTION,
    assert_images_go_in_order,
    png,
    prompt_with,
    reference_greedy,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

from tensorrtllm_backend.common.processors import load_processor  # noqa: E402
from tensorrtllm_backend.packing.demo_qwen2vl import build_demo_qwen2vl_checkpoint  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.block_cache import BlockTable  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.hf import HFBackend  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler  # noqa: E402

# 40 x 30 pixels become a 2 x 3 grid of image tokens, 100 x 50 a 2 x 4 one (min/max pixels).
RED, BLUE, WIDE = png((200, 10, 10)), png((10, 10, 200)), png((10, 200, 10), (100, 50))
OTHER_WIDE = png((200, 200, 10), (100, 50))


@pytest.fixture(scope="module", params=["qwen2-vl", "qwen2.5-vl"])
def checkpoint(request, tmp_path_factory):
    return build_demo_qwen2vl_checkpoint(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module")
def processor(checkpoint):
    return load_processor(checkpoint)


@pytest.fixture
def backend(checkpoint) -> HFBackend:
    return HFBackend(checkpoint, num_threads=1, device="cpu")


def run_staggered(backend: HFBackend, requests: list) -> list:
    """Each request joins once the one before it produced a token: its prompt goes in the
    same forward as the others' decoding tokens."""
    scheduler = Scheduler(backend, max_batch_size=8)
    scheduler.start()
    try:
        for req, sink in requests:
            scheduler.submit(req)
            assert sink.first_token.wait(60)
        for _, sink in requests:
            assert sink.done.wait(60) and sink.error is None, sink.error
    finally:
        scheduler.stop()
    return [req.generated for req, _ in requests]


def test_the_prompt_has_3d_positions(backend, processor) -> None:
    """The case under test: the positions of an image prompt are not its columns, and its
    generated tokens go on from length + a negative delta."""
    ids, encoded = prompt_with(processor, [WIDE])
    assert encoded["image_grid_thw"].tolist() == [[1, 4, 8]]  # patches: 2 x 4 image tokens
    assert backend._images is not None and backend._images.mrope is not None
    positions, delta = backend._images.mrope.prompt(ids, encoded["image_grid_thw"])
    assert positions.shape == (3, len(ids))
    assert not torch.equal(positions[1], positions[2])  # height and width differ in the image
    assert delta == -4  # its 8 tokens advance the positions by 4, its longer side


def test_images_and_text_in_one_step_equal_transformers(backend, processor) -> None:
    one, one_encoded = prompt_with(processor, [RED])
    two, two_encoded = prompt_with(processor, [BLUE, WIDE])
    text, text_encoded = prompt_with(processor, [], "Hello there, what is new?")
    logged = {"return_log_probs": True}
    requests = [
        make_request(one, 6, images=[RED], min_tokens=6, end_id=2, **logged),
        make_request(two, 6, images=[BLUE, WIDE], min_tokens=6, end_id=2),
        make_request(text, 6, min_tokens=6, end_id=2),
        make_request(one, 6, images=[BLUE], min_tokens=6, end_id=2, **logged),
    ]
    got = run_on(backend, requests)
    assert got[:3] == [
        reference_greedy(backend.model, one_encoded, 6),
        reference_greedy(backend.model, two_encoded, 6),
        reference_greedy(backend.model, text_encoded, 6),
    ]
    # The same tokens, another image: the model sees another prompt.
    assert requests[0][0].logprobs != requests[3][0].logprobs


def test_prompts_joining_beside_decoding_requests_equal_transformers(backend, processor) -> None:
    """Decoding tokens at length + their request's delta, in one forward with a joining
    prompt's 3-D positions, a text prompt's and another image prompt's."""
    one, one_encoded = prompt_with(processor, [WIDE])
    text, text_encoded = prompt_with(processor, [], "Tell me about the weather.")
    two, two_encoded = prompt_with(processor, [RED, WIDE], "Which one is wider?")
    requests = [
        make_request(one, 12, images=[WIDE], min_tokens=12, end_id=2, streaming=True),
        make_request(text, 10, min_tokens=10, end_id=2, streaming=True),
        make_request(two, 8, images=[RED, WIDE], min_tokens=8, end_id=2, streaming=True),
    ]
    got = run_staggered(backend, requests)
    assert got == [
        reference_greedy(backend.model, one_encoded, 12),
        reference_greedy(backend.model, text_encoded, 10),
        reference_greedy(backend.model, two_encoded, 8),
    ]


def test_two_images_in_one_prompt_go_in_order(backend, processor) -> None:
    assert_images_go_in_order(backend, processor, WIDE, RED)


def test_a_prefix_cache_hit_keeps_the_requests_positions(checkpoint, processor) -> None:
    """The reused blocks hold the image's tokens: the rest of the prompt goes on from its 3-D
    positions, and the generated tokens from the rope delta, computed from the whole prompt."""
    table = BlockTable(block_size=4, max_blocks=256)
    backend = HFBackend(checkpoint, num_threads=1, device="cpu", reuse=table)
    ids, encoded = prompt_with(processor, [WIDE])
    run_on(backend, [make_request(ids, 3, images=[WIDE], min_tokens=3, end_id=2)])
    longer, longer_encoded = prompt_with(processor, [WIDE], QUESTION + " Answer in one word.")
    again = make_request(ids, 5, images=[WIDE], min_tokens=5, end_id=2)
    extended = make_request(longer, 5, images=[WIDE], min_tokens=5, end_id=2)
    other_ids, other_encoded = prompt_with(processor, [OTHER_WIDE])
    assert other_ids == ids  # the same tokens: only the image differs
    other = make_request(ids, 5, images=[OTHER_WIDE], min_tokens=5, end_id=2)
    got = run_on(backend, [again]) + run_on(backend, [extended]) + run_on(backend, [other])
    image_end = max(i for i, token in enumerate(ids) if token == backend._images.token_id)
    assert again[0].cached_tokens > image_end  # past the image: its tokens come from the cache
    assert extended[0].cached_tokens > image_end
    assert other[0].cached_tokens == 0  # another image: nothing matches
    assert got == [
        reference_greedy(backend.model, encoded, 5),
        reference_greedy(backend.model, longer_encoded, 5),
        reference_greedy(backend.model, other_encoded, 5),
    ]


def test_text_only_steps_pass_the_columns(backend, processor) -> None:
    """No image in a step: the positions are the columns, as for a text model (no 3-D ids)."""
    seen = []
    hook = backend.model.model.language_model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["position_ids"].shape), with_kwargs=True
    )
    try:
        text, text_encoded = prompt_with(processor, [], "Hello there, what is new?")
        got = run_on(backend, [make_request(text, 3, min_tokens=3, end_id=2)])
    finally:
        hook.remove()
    assert got == [reference_greedy(backend.model, text_encoded, 3)]
    assert len(seen) == 3 and all(len(shape) == 2 for shape in seen)  # [1, tokens] each
