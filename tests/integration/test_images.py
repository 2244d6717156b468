"""Images in, through the real clients against `bentoml serve` of the demo vision-language model
(a tiny random LLaVA, `pack_model.py --demo-vlm`) on both token-id routes: the CPU engine in the
`tensorrt_llm` slot (direct) and our llmapi model on its CPU stand-in. The image reaches the
model (two images give two different first-token log probs), every API brings it (openai chat,
streamed and not; Responses `input_image`; anthropic `image` blocks; the native `images`), in a
tool result too (Claude Code's Read of an image file, Codex's `view_image`), usage counts its
tokens, and abuse is a 400 with nothing fetched. A LLaVA checkpoint made here with
transformers packs with `--hf-model` and serves images too."""

from __future__ import annotations

import base64
import io
import shutil
import struct
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from conftest import CLIENT_TIMEOUT_S, BentoServer, openai_client, pack, start_bento_server
from PIL import Image

from tensorrtllm_backend.packing.demo import IMAGE_TOKEN, VLM_IMAGE_TOKENS

LIMITS = ("--max-input-len", "256", "--max-seq-len", "512")


def png(color: tuple[int, int, int], size: tuple[int, int] = (48, 32)) -> bytes:
    buffer = io.BytesIO()
    image = Image.new("RGB", size, color)
    for x in range(0, size[0], 5):  # some structure, so the two images differ beyond colour
        image.putpixel((x, x % size[1]), (255 - color[0], 255 - color[1], 255 - color[2]))
    image.save(buffer, "PNG")
    return buffer.getvalue()


RED, BLUE = png((220, 20, 20)), png((20, 20, 220))


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def image_chat(data: bytes, text: str = "What is in the picture?") -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": data_uri(data), "detail": "auto"}},
            ],
        }
    ]


@pytest.fixture(scope="session")
def vlm_model() -> str:
    return pack("--demo-vlm", *LIMITS)


@pytest.fixture(scope="session")
def llmapi_vlm_model() -> str:
    return pack("--demo-vlm", "--workflow", "llmapi", *LIMITS)


@pytest.fixture(scope="module", params=["direct", "llmapi"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BentoServer]:
    tag = request.getfixturevalue("vlm_model" if request.param == "direct" else "llmapi_vlm_model")
    started = start_bento_server(tag, tmp_path_factory.mktemp(f"vlm-{request.param}"))
    yield started
    started.stop()


def tool_chat(data: bytes) -> list[dict[str, Any]]:
    """A tool's result that holds an image, as every API's tool result reaches the chat core."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "view_image", "arguments": "{}"},
    }
    return [
        {"role": "user", "content": "What is in a.png?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": [
            {"type": "text", "text": "a.png:"},
            {"type": "image_url", "image_url": {"url": data_uri(data)}}]},
    ]  # fmt: skip


def first_log_probs(
    client: openai.OpenAI, model: str, data: bytes, chat: Any = image_chat
) -> list[float]:
    answer = client.chat.completions.create(
        model=model, messages=chat(data), max_tokens=1, temperature=0, logprobs=True,
        top_logprobs=5,
    )  # fmt: skip
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    return [entry.logprob for entry in content[0].top_logprobs]


def test_the_image_reaches_the_model(client: openai.OpenAI, model: str) -> None:
    red = first_log_probs(client, model, RED)
    assert red == first_log_probs(client, model, RED)  # the same image: the same numbers
    assert red != first_log_probs(client, model, BLUE)


def check_chat_with_an_image(client: openai.OpenAI, model: str, image_tokens: int) -> None:
    """An image chat answers, streamed as whole, and its prompt counts `image_tokens` more than
    its text alone."""
    whole = client.chat.completions.create(
        model=model, messages=image_chat(RED), max_tokens=6, temperature=0
    )
    assert whole.choices[0].message.content
    text_only = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is in the picture?"}],
        max_tokens=1,
    )
    assert whole.usage is not None and text_only.usage is not None
    # The image's tokens count in the prompt (its text part is the same).
    assert whole.usage.prompt_tokens == text_only.usage.prompt_tokens + image_tokens
    stream = client.chat.completions.create(
        model=model, messages=image_chat(RED), max_tokens=6, temperature=0, stream=True
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == whole.choices[0].message.content


def test_openai_chat_with_an_image_streamed_and_not(client: openai.OpenAI, model: str) -> None:
    check_chat_with_an_image(client, model, VLM_IMAGE_TOKENS)


def test_responses_input_image(client: openai.OpenAI, model: str) -> None:
    text_part = {"type": "input_text", "text": "What is in the picture?"}
    image = {"type": "input_image", "image_url": data_uri(BLUE), "detail": "low"}
    answer = client.responses.create(
        model=model, input=[{"role": "user", "content": [text_part, image]}], max_output_tokens=6
    )
    assert answer.output and answer.usage is not None  # incomplete: max_output_tokens ran out
    assert answer.usage.input_tokens > VLM_IMAGE_TOKENS


def claude(server: BentoServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                               timeout=CLIENT_TIMEOUT_S)  # fmt: skip


def image_block(data: bytes) -> dict[str, Any]:
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()}
    return {"type": "image", "source": source}


def test_anthropic_image_block(server: BentoServer, model: str) -> None:
    client = claude(server)
    messages: Any = [
        {"role": "user", "content": [image_block(RED), {"type": "text", "text": "What is it?"}]}
    ]
    answer = client.messages.create(model=model, max_tokens=6, messages=messages)
    assert answer.content and answer.usage.input_tokens > VLM_IMAGE_TOKENS
    counted = client.messages.count_tokens(model=model, messages=messages)
    assert counted.input_tokens == answer.usage.input_tokens + (
        answer.usage.cache_read_input_tokens or 0
    )
    with client.messages.stream(model=model, max_tokens=6, messages=messages) as stream:
        assert stream.get_final_message().content


def read_image_turn(*images: dict[str, Any]) -> Any:
    """Claude Code's Read of an image file: the tool_result holds the image blocks."""
    result = [{"type": "text", "text": "a.png:"}, *images]
    return [
        {"role": "user", "content": "What is in a.png?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a.png"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]},
    ]  # fmt: skip


def view_image_items(*images: dict[str, Any]) -> Any:
    """Codex's view_image: the function_call_output's output holds the input_image parts."""
    output = [{"type": "input_text", "text": "a.png:"}, *images]
    return [
        {"role": "user", "content": "What is in a.png?"},
        {"type": "function_call", "call_id": "call_1", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": output},
    ]


def input_image(data: bytes) -> dict[str, Any]:
    return {"type": "input_image", "image_url": data_uri(data)}


def test_a_tool_results_image_reaches_the_model(client: openai.OpenAI, model: str) -> None:
    red = first_log_probs(client, model, RED, tool_chat)
    assert red != first_log_probs(client, model, BLUE, tool_chat)


def test_anthropic_tool_result_image(server: BentoServer, model: str) -> None:
    client = claude(server)
    answer = client.messages.create(
        model=model, max_tokens=4, messages=read_image_turn(image_block(RED))
    )
    assert answer.content
    counted = client.messages.count_tokens(model=model, messages=read_image_turn(image_block(RED)))
    text_only = client.messages.count_tokens(model=model, messages=read_image_turn())
    assert counted.input_tokens == text_only.input_tokens + VLM_IMAGE_TOKENS
    assert counted.input_tokens == answer.usage.input_tokens + (
        answer.usage.cache_read_input_tokens or 0
    )


def test_responses_function_call_output_image(client: openai.OpenAI, model: str) -> None:
    answer = client.responses.create(
        model=model, input=view_image_items(input_image(BLUE)), max_output_tokens=4, store=False
    )
    text_only = client.responses.create(
        model=model, input=view_image_items(), max_output_tokens=1, store=False
    )
    assert answer.output and answer.usage is not None and text_only.usage is not None
    assert answer.usage.input_tokens == text_only.usage.input_tokens + VLM_IMAGE_TOKENS


def test_the_native_api_takes_images(server: BentoServer) -> None:
    body = {"prompt": f"{IMAGE_TOKEN}Describe:", "images": [data_uri(RED)], "max_tokens": 4}
    response = httpx.post(f"{server.url}/generate_text", json=body, timeout=CLIENT_TIMEOUT_S)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] > VLM_IMAGE_TOKENS
    body["images"] = [data_uri(RED), data_uri(BLUE)]  # two images, one placeholder
    response = httpx.post(f"{server.url}/generate_text", json=body, timeout=CLIENT_TIMEOUT_S)
    assert response.status_code == 400 and "placeholder" in response.text


def test_models_list_shows_the_image_token(server: BentoServer) -> None:
    card = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]
    assert card["image_token"] == IMAGE_TOKEN


# --- abuse ----------------------------------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    """A web server that counts what it is asked for (nothing should reach it)."""

    hits: list[str] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(302)
        self.send_header("Location", "http://127.0.0.1:1/elsewhere.png")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def web() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def bomb() -> bytes:
    """A PNG of a few hundred bytes whose header claims 40000 x 40000 pixels."""
    width = height = 40_000
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grey

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = zlib.compress(b"\x00" * 1024)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    )


def fifty_megapixels() -> bytes:
    buffer = io.BytesIO()
    Image.new("1", (10_000, 5_000)).save(buffer, "PNG")  # 1-bit: a small file, 50 MP
    return buffer.getvalue()


@pytest.fixture(scope="module")
def abuse_cases(web: str) -> dict[str, tuple[list[dict[str, Any]], str]]:
    def part(url: str) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": url}}

    return {
        "bomb": ([part(data_uri(bomb()))], "pixels"),
        "50 MP": ([part(data_uri(fifty_megapixels()))], "pixels"),
        "too many": ([part(data_uri(RED))] * 9, "the limit is 8 per request"),
        "bad base64": ([part("data:image/png;base64,!!!!notbase64")], "base64"),
        "file": ([part("file:///etc/passwd")], "file"),
        "private": ([part("http://10.0.0.1/cat.png")], "TRTLLM_ALLOWED_MEDIA_DOMAINS"),
        "link-local": ([part("http://169.254.169.254/latest/meta-data")], "ALLOWED_MEDIA"),
        "remote off": ([part(f"{web}/cat.png")], "remote image URLs are off"),
    }


@pytest.mark.parametrize(
    "case",
    ["bomb", "50 MP", "too many", "bad base64", "file", "private", "link-local", "remote off"],
)
def test_abuse_is_a_400_naming_the_image(
    client: openai.OpenAI, model: str, abuse_cases: dict, case: str, web: str
) -> None:
    parts, message = abuse_cases[case]
    hits = len(_Recorder.hits)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": parts}], max_tokens=2
        )
    assert message in str(caught.value.body) and "messages[0].content[" in str(caught.value.body)
    assert len(_Recorder.hits) == hits  # nothing fetched


def test_an_allowed_host_at_a_loopback_address_is_refused(
    vlm_model: str, tmp_path: Path, web: str
) -> None:
    """With the test server's host allowed, a URL of it is still refused unfetched: it resolves
    to a loopback address (the check is on the resolved address, the one connected to).
    Redirects to other hosts are covered where a resolver can be pointed at a test server:
    tests/unit/common/test_media.py."""
    allowed = {"TRTLLM_ALLOWED_MEDIA_DOMAINS": "127.0.0.1,localhost"}
    started = start_bento_server(vlm_model, tmp_path, allowed)
    try:
        client = openai_client(started, CLIENT_TIMEOUT_S)
        model = client.models.list().data[0].id
        hits = len(_Recorder.hits)
        for host in ("127.0.0.1", "localhost"):
            part = {
                "type": "image_url",
                "image_url": {"url": f"{web.replace('127.0.0.1', host)}/x"},
            }
            with pytest.raises(openai.BadRequestError, match="non-public address"):
                client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": [part]}], max_tokens=2
                )
        assert len(_Recorder.hits) == hits
    finally:
        started.stop()


def test_a_text_only_model_refuses_images(demo_server: BentoServer) -> None:
    client = openai_client(demo_server, CLIENT_TIMEOUT_S)
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError, match="does not take images"):
        client.chat.completions.create(model=model, messages=image_chat(RED), max_tokens=2)


def test_a_text_only_model_refuses_a_tool_results_image_naming_it(
    demo_server: BentoServer,
) -> None:
    client = openai_client(demo_server, CLIENT_TIMEOUT_S)
    model = client.models.list().data[0].id
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(demo_server).messages.create(
            model=model, max_tokens=2, messages=read_image_turn(image_block(RED))
        )
    message = refused.value.body["error"]["message"]  # type: ignore[index]
    assert message.startswith("messages.2.content.0.content.1: this model does not take images")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model=model, input=view_image_items(input_image(RED)), max_output_tokens=2
        )
    assert caught.value.param == "input[2].output[1]"
    assert "input[2].output[1]: this model does not take images" in str(caught.value.body)


def test_a_llava_checkpoint_made_with_transformers_packs_and_serves_images(
    tmp_path: Path, vlm_checkpoint_copy: Path
) -> None:
    tag = pack("--hf-model", str(vlm_checkpoint_copy), "--name", "made-llava", *LIMITS)
    started = start_bento_server(tag, tmp_path)
    try:
        client = openai_client(started, CLIENT_TIMEOUT_S)
        model = client.models.list().data[0].id
        red = first_log_probs(client, model, RED)
        assert red != first_log_probs(client, model, BLUE)
    finally:
        started.stop()


@pytest.fixture
def vlm_checkpoint_copy(tmp_path: Path) -> Path:
    """A LLaVA checkpoint saved by transformers here (random weights, its own seed)."""
    import torch
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from tensorrtllm_backend.packing.demo import build_demo_vlm_checkpoint

    built = build_demo_vlm_checkpoint(tmp_path / "built")
    processor = AutoProcessor.from_pretrained(str(built))
    torch.manual_seed(1234)
    config = LlavaForConditionalGeneration.config_class.from_pretrained(str(built))
    model = LlavaForConditionalGeneration(config)
    out = tmp_path / "llava"
    model.save_pretrained(out)
    processor.save_pretrained(out)
    shutil.rmtree(built)
    return out
