"""Images in for the Qwen2-VL family, through the official openai client against `bentoml serve`
of the demo Qwen2-VL (`pack_model.py --demo-vlm --demo-vlm-family qwen2-vl`) on both token-id
routes: the CPU engine in the `tensorrt_llm` slot (direct) and our llmapi model on its CPU
stand-in. Its processor expands each image into as many tokens as its size makes, and the
engine runs them with their 3-D rotary positions: an image request is answered, two images give
two different first-token log probs, and usage counts the image's tokens."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from conftest import BentoServer, pack, start_bento_server
from test_images import BLUE, RED, check_chat_with_an_image, first_log_probs

LIMITS = ("--max-input-len", "256", "--max-seq-len", "512")
QWEN2VL = ("--demo-vlm", "--demo-vlm-family", "qwen2-vl", *LIMITS)
# A 48 x 32 image is resized to 84 x 56 pixels (the processor's minimum area): 3 x 2 image
# tokens of 28 x 28, between the template's <|vision_start|> and <|vision_end|>.
IMAGE_PROMPT_TOKENS = 3 * 2 + 2


@pytest.fixture(scope="module", params=["direct", "llmapi"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BentoServer]:
    workflow = ("--workflow", "llmapi") if request.param == "llmapi" else ()
    tag = pack(*QWEN2VL, *workflow)
    started = start_bento_server(tag, tmp_path_factory.mktemp(f"qwen2vl-{request.param}"))
    yield started
    started.stop()


def test_the_image_reaches_the_model(client: openai.OpenAI, model: str) -> None:
    red = first_log_probs(client, model, RED)
    # The same image: the same numbers, up to float rounding where the second request reuses
    # the first's cached prefix (the llmapi stand-in's default) and computes its last tokens in
    # a forward of another shape.
    assert first_log_probs(client, model, RED) == pytest.approx(red, abs=1e-5)
    assert first_log_probs(client, model, BLUE) != pytest.approx(red, abs=1e-3)


def test_an_image_request_is_answered_and_its_tokens_counted(
    client: openai.OpenAI, model: str
) -> None:
    check_chat_with_an_image(client, model, IMAGE_PROMPT_TOKENS)
