"""Images through the chat core, as every API brings them (in tool results too): found in the
messages, read within the limits, placed by the demo VLM's own processor (each image's placeholder expanded in the prompt
the engine sees, written once in the prompt the LLM API takes), and sent as the routes' `images`
input. Nothing is generated: Triton is never called."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from starlette.testclient import TestClient

from tensorrtllm_backend.common.media import MediaLimits
from tensorrtllm_backend.packing.demo import IMAGE_TOKEN, VLM_IMAGE_TOKENS
from tensorrtllm_backend.serving.anthropic_api.conversion import chat_messages
from tensorrtllm_backend.serving.anthropic_api.conversion import chat_request as anthropic_chat
from tensorrtllm_backend.serving.anthropic_api.protocol import MessagesRequest
from tensorrtllm_backend.serving.api_surface import root_app
from tensorrtllm_backend.serving.chat.core import ChatCore, chat_request
from tensorrtllm_backend.serving.chat.images import Vision
from tensorrtllm_backend.serving.generation import EngineLimits, Generator
from tensorrtllm_backend.serving.request_errors import RequestError
from tensorrtllm_backend.serving.responses_api.conversion import (
    chat_messages as response_messages,
)
from tensorrtllm_backend.serving.responses_api.conversion import chat_request as responses_chat
from tensorrtllm_backend.serving.responses_api.conversion import parse_items
from tensorrtllm_backend.serving.responses_api.protocol import ResponsesRequest
from tensorrtllm_backend.serving.triton_paths.direct import DirectRoute
from tensorrtllm_backend.serving.triton_paths.llmapi import LlmapiRoute
from tensorrtllm_backend.triton.client import TritonLLMClient


def data_uri(color: tuple[int, int, int], kind: str = "PNG") -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (30, 20), color).save(buffer, kind)
    return f"data:image/{kind.lower()};base64,{base64.b64encode(buffer.getvalue()).decode()}"


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": "low"}}


def ask(*parts: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "vlm",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "What is it?"}, *parts]},
        ],
        "max_tokens": 4,
    }


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tensorrtllm_backend.packing.demo import build_demo_vlm_checkpoint

    return build_demo_vlm_checkpoint(tmp_path_factory.mktemp("vlm") / "checkpoint")


def make_core(directory: Path, vision: bool, limits: MediaLimits | None = None) -> ChatCore:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(directory))
    client = TritonLLMClient.__new__(TritonLLMClient)  # never called
    generator = Generator(client, processor.tokenizer, EngineLimits(256, 512))
    token = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    record = {"image_token": IMAGE_TOKEN, "image_token_id": token}
    found = Vision(processor, limits or MediaLimits(), record) if vision else None
    return ChatCore(generator, "vlm", vision=found, images_unsupported="no images here")


@pytest.fixture(scope="module")
def core(vlm_dir: Path) -> ChatCore:
    return make_core(vlm_dir, vision=True)


def prepare(core: ChatCore, body: dict[str, Any]):
    return asyncio.run(core.prepare(chat_request(body, {}), size=1))[0]


def test_an_image_is_placed_expanded_for_the_engine_and_once_for_the_llm_api(
    core: ChatCore,
) -> None:
    token = core.vision.image_token_id  # type: ignore[union-attr]
    prepared = prepare(core, ask(image_part(data_uri((200, 0, 0)))))
    assert prepared.prompt_ids.count(token) == VLM_IMAGE_TOKENS
    assert prepared.written_ids is not None and prepared.written_ids.count(token) == 1
    assert [image.format for image in prepared.images] == ["PNG"]
    # The rest of the prompt is the same text either way.
    assert [t for t in prepared.prompt_ids if t != token] == [
        t for t in prepared.written_ids if t != token
    ]
    tensors, _ = DirectRoute(core.generator.tokenizer).inputs(prepared, None)
    assert tensors["images"].shape == (1, 1) and tensors["images"][0, 0] == prepared.images[0].data
    assert tensors["input_ids"].shape == (1, len(prepared.prompt_ids))
    tensors, _ = LlmapiRoute(core.generator.tokenizer).inputs(prepared, None)
    assert tensors["images"].shape == (1,)
    assert tensors["input_ids"].tolist() == prepared.written_ids


def test_images_count_in_tokenize_and_usage(core: ChatCore) -> None:
    body = ask(image_part(data_uri((1, 2, 3))), image_part(data_uri((4, 5, 6), "JPEG")))
    prepared = prepare(core, body)
    http = TestClient(root_app(lambda: core, lambda: None))
    response = http.post("/tokenize", json={"messages": body["messages"]})
    assert response.status_code == 200, response.text
    assert response.json()["count"] == len(prepared.prompt_ids)
    text_only = http.post("/tokenize", json={"messages": ask()["messages"]}).json()["count"]
    assert response.json()["count"] == text_only + 2 * VLM_IMAGE_TOKENS


@pytest.mark.parametrize(
    ("part", "message", "where"),
    [
        (image_part("data:image/png;base64,@@@@@@@@"), "base64", "messages[1].content[1]"),
        (image_part("https://example.com/cat.png"), "TRTLLM_ALLOWED_MEDIA_DOMAINS", "messages[1].content[1]"),
        (image_part("file:///etc/passwd"), "file", "messages[1].content[1]"),
        ({"type": "image_url", "image_url": {}}, "image_url", "messages[1].content[1].image_url"),
        ({"type": "input_audio", "input_audio": {}}, "input_audio", "messages"),
    ],
)  # fmt: skip
def test_images_that_cannot_be_read_are_a_400_naming_them(
    core: ChatCore, part: dict[str, Any], message: str, where: str
) -> None:
    with pytest.raises(RequestError) as caught:
        prepare(core, ask(part))
    assert caught.value.status == 400
    assert message in str(caught.value) and caught.value.param == where


def test_too_many_images_are_refused_before_any_is_read(vlm_dir: Path) -> None:
    core = make_core(vlm_dir, vision=True, limits=MediaLimits(max_images=2))
    parts = [image_part(data_uri((i, i, i))) for i in range(2)] + [image_part("file:///x")]
    with pytest.raises(RequestError, match="the limit is 2 per request") as caught:
        prepare(core, ask(*parts))
    assert caught.value.param == "messages[1].content[3]"  # the first image over the limit


def test_a_model_that_takes_no_images_says_so(vlm_dir: Path) -> None:
    core = make_core(vlm_dir, vision=False)
    with pytest.raises(RequestError, match="no images here") as caught:
        prepare(core, ask(image_part(data_uri((9, 9, 9)))))
    assert caught.value.param == "messages[1].content[1]"
    assert prepare(core, ask()).images == ()  # text alone is served


def test_the_apis_bring_images_as_image_url_parts() -> None:
    png = data_uri((7, 7, 7))
    anthropic = MessagesRequest.model_validate(
        {
            "model": "vlm",
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Look:"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": png.split(",", 1)[1],
                            },
                        },
                        {"type": "image", "source": {"type": "url", "url": "https://a.example/x"}},
                    ],
                }
            ],
        }
    )
    assert chat_messages(None, anthropic.messages) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                # Each names its block: errors quote the place in the Anthropic request.
                {"type": "image_url", "image_url": {"url": png}, "where": "messages.0.content.1"},
                {
                    "type": "image_url",
                    "image_url": {"url": "https://a.example/x"},
                    "where": "messages.0.content.2",
                },
            ],
        }
    ]
    items = parse_items(
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Look:"},
                    {"type": "input_image", "image_url": png, "detail": "auto"},
                ],
            }
        ]
    )
    assert response_messages(None, items) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": png}, "where": "input[0].content[1]"},
            ],
        }
    ]


# --- images in tool results -------------------------------------------------------------------


def anthropic_tool_turn(*result: dict[str, Any], first: list[Any] | None = None) -> MessagesRequest:
    """Claude Code's Read of an image file: the tool result holds the image among its text."""
    return MessagesRequest.model_validate(
        {
            "model": "vlm",
            "max_tokens": 4,
            "messages": [
                {"role": "user", "content": first or "Open a.png."},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a.png"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": list(result)}]},
            ],
        }
    )  # fmt: skip


def anthropic_image(url: str) -> dict[str, Any]:
    media_type, data = url.removeprefix("data:").split(";base64,")
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def responses_tool_turn(*output: dict[str, Any]) -> tuple[ResponsesRequest, list[Any]]:
    """Codex's view_image: the function's output holds the image among its text."""
    items = [
        {"role": "user", "content": "Look at a.png."},
        {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": list(output)},
    ]
    return ResponsesRequest(model="vlm", input=items), parse_items(items)


def tool_turn_chats(core: ChatCore, *urls: str) -> list[Any]:
    """The chat requests of the same tool result from both APIs: its text, then `urls`' images."""
    anthropic = anthropic_tool_turn(
        {"type": "text", "text": "a.png:"}, *(anthropic_image(url) for url in urls)
    )
    request, items = responses_tool_turn(
        {"type": "input_text", "text": "a.png:"},
        *({"type": "input_image", "image_url": url} for url in urls),
    )
    return [anthropic_chat(anthropic, core), responses_chat(request, items)]


def test_a_tool_results_images_are_placed_where_the_result_stands(core: ChatCore) -> None:
    token = core.vision.image_token_id  # type: ignore[union-attr]
    with_image = tool_turn_chats(core, data_uri((0, 90, 0)))
    text_only = tool_turn_chats(core)
    for chat, text in zip(with_image, text_only, strict=True):
        assert chat.messages[-1].role == "tool"
        assert f"<tool_response>\na.png:{IMAGE_TOKEN}\n</tool_response>" in core.render(chat)
        prepared = asyncio.run(core.prepare(chat, size=1))[0]
        assert prepared.prompt_ids.count(token) == VLM_IMAGE_TOKENS
        assert [image.format for image in prepared.images] == ["PNG"]
        # Its tokens count (count_tokens, usage) as any image's.
        assert core.prompt_tokens(chat) == len(prepared.prompt_ids)
        assert core.prompt_tokens(chat) == core.prompt_tokens(text) + VLM_IMAGE_TOKENS


def test_a_tool_results_images_count_toward_the_limits_and_are_named(vlm_dir: Path) -> None:
    core = make_core(vlm_dir, vision=True, limits=MediaLimits(max_images=1))
    first = [anthropic_image(data_uri((1, 1, 1))), {"type": "text", "text": "and a.png?"}]
    request = anthropic_tool_turn(anthropic_image(data_uri((2, 2, 2))), first=first)
    with pytest.raises(RequestError, match="the limit is 1 per request") as caught:
        asyncio.run(core.prepare(anthropic_chat(request, core), size=1))
    assert caught.value.param == "messages.2.content.0.content.0"
    bad = {"type": "input_image", "image_url": "data:image/png;base64,@@@@@@@@"}
    with pytest.raises(RequestError, match="base64") as caught:
        asyncio.run(core.prepare(responses_chat(*responses_tool_turn(bad)), size=1))
    assert caught.value.param == "input[2].output[0]"
    assert str(caught.value).startswith("input[2].output[0]: ")


def test_a_model_that_takes_no_images_names_the_tool_results_image(vlm_dir: Path) -> None:
    core = make_core(vlm_dir, vision=False)
    chats = tool_turn_chats(core, data_uri((3, 3, 3)))
    places = ["messages.2.content.0.content.1", "input[2].output[1]"]
    for chat, where in zip(chats, places, strict=True):
        with pytest.raises(RequestError) as answered:
            asyncio.run(core.prepare(chat, size=1))
        # Counted (count_tokens, context edits, truncation): the same refusal.
        with pytest.raises(RequestError) as counted:
            core.prompt_tokens(chat)
        for caught in (answered, counted):
            assert caught.value.status == 400 and caught.value.param == where
            assert str(caught.value) == f"{where}: no images here"
