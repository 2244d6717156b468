"""hf backend on the demo vision-language model (a tiny LLaVA): a prompt's images reach the
model as transformers runs it (the vision tower's embeddings in place of the image tokens), in
one packed step with other requests; its prefix cache keys blocks by the images too."""

from __future__ import annotations

import os

import pytest
from cpu_engine_helpers import make_request, run_on
from vlm_engine_helpers import assert_images_go_in_order, png, prompt_with, reference_greedy

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

from tensorrtllm_backend.packing.demo import build_demo_vlm_checkpoint  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.block_cache import BlockTable  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.hf import HFBackend  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_demo_vlm_checkpoint(tmp_path_factory.mktemp("vlm") / "checkpoint")


@pytest.fixture(scope="module")
def processor(checkpoint):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(checkpoint))


def refusal(backend: HFBackend, request: tuple) -> str:
    """The error a request fails with on this backend."""
    req, sink = request
    scheduler = Scheduler(backend, max_batch_size=2)
    scheduler.start()
    try:
        scheduler.submit(req)
        assert sink.done.wait(60)
    finally:
        scheduler.stop()
    assert sink.error is not None
    return sink.error


def test_images_reach_the_model_as_transformers_runs_it(checkpoint, processor) -> None:
    backend = HFBackend(checkpoint, num_threads=1, device="cpu")
    assert backend.takes_images
    red, blue = png((200, 10, 10)), png((10, 10, 200))
    logged = {"return_log_probs": True}
    prompts = {
        color: prompt_with(processor, [data]) for color, data in (("red", red), ("blue", blue))
    }
    requests = [
        make_request(prompts["red"][0], 6, images=[red], min_tokens=6, end_id=2, **logged),
        make_request(prompts["blue"][0], 6, images=[blue], min_tokens=6, end_id=2, **logged),
        make_request(prompts["red"][0][:5], 6, min_tokens=6, end_id=2),  # text, same step
    ]
    got = run_on(backend, requests)
    assert got[0] == reference_greedy(backend.model, prompts["red"][1], 6)
    assert got[1] == reference_greedy(backend.model, prompts["blue"][1], 6)
    # The same tokens, another image: the model sees another prompt.
    assert prompts["red"][0] == prompts["blue"][0]
    red_log_probs, blue_log_probs = (req.logprobs for req, _ in requests[:2])
    assert red_log_probs != blue_log_probs


def test_two_images_in_one_prompt_go_in_order(checkpoint, processor) -> None:
    backend = HFBackend(checkpoint, num_threads=1, device="cpu")
    assert_images_go_in_order(backend, processor, png((200, 10, 10)), png((10, 10, 200)))


def test_a_prompt_whose_image_tokens_do_not_fit_its_images_is_refused(
    checkpoint, processor
) -> None:
    backend = HFBackend(checkpoint, num_threads=1, device="cpu")
    ids, _ = prompt_with(processor, [png((1, 2, 3))])
    error = refusal(backend, make_request(ids, 2, images=[png((1, 2, 3)), png((4, 5, 6))]))
    assert "image tokens" in error


def test_the_prefix_cache_never_matches_across_images(checkpoint, processor) -> None:
    table = BlockTable(block_size=4, max_blocks=256)
    backend = HFBackend(checkpoint, num_threads=1, device="cpu", reuse=table)
    red, blue = png((200, 10, 10)), png((10, 10, 200))
    ids, encoded = prompt_with(processor, [red])
    first = make_request(ids, 3, images=[red], min_tokens=3, end_id=2)
    run_on(backend, [first])
    again = make_request(ids, 3, images=[red], min_tokens=3, end_id=2)
    other_ids, other_encoded = prompt_with(processor, [blue])
    assert other_ids == ids  # the same tokens: only the image differs
    other = make_request(other_ids, 3, images=[blue], min_tokens=3, end_id=2)
    got = run_on(backend, [again])
    got += run_on(backend, [other])
    assert again[0].cached_tokens > 0  # the same image: its blocks are reused
    assert other[0].cached_tokens == 0  # another image: nothing matches
    assert got == [
        reference_greedy(backend.model, encoded, 3),
        reference_greedy(backend.model, other_encoded, 3),
    ]


def test_an_engine_without_images_refuses_them(demo_checkpoint) -> None:
    backend = HFBackend(demo_checkpoint, num_threads=1, device="cpu")
    assert not backend.takes_images
    assert "takes no images" in refusal(
        backend, make_request([1, 5, 6], 2, images=[png((1, 2, 3))])
    )
