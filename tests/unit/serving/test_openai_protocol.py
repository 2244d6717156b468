"""The OpenAI request models' own rules: stream_options only with a stream and how a stream
reports usage, chat_template_kwargs limited to the template's variables, best_of's ranking, and
the four shapes of a completion's prompt."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from tensorrtllm_backend.serving.chat.request import UsageReport
from tensorrtllm_backend.serving.chat.stream import SequenceAnswer
from tensorrtllm_backend.serving.openai_api.completions import best_sequences
from tensorrtllm_backend.serving.openai_api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate_json(json.dumps(body))


@pytest.mark.parametrize(
    ("options", "report"),
    [
        (None, UsageReport()),
        ({"include_usage": False, "continuous_usage_stats": True}, UsageReport()),
        ({"include_usage": True}, UsageReport(final=True)),
        ({"include_usage": True, "continuous_usage_stats": True}, UsageReport(True, True)),
    ],
)
def test_how_a_stream_reports_usage(options: dict[str, bool] | None, report: UsageReport) -> None:
    assert chat(stream=True, stream_options=options).usage_report() == report


def test_stream_options_without_a_stream_are_refused() -> None:
    assert chat(stream_options={"include_usage": True}).unsupported() == (
        "stream_options",
        "stream_options is only allowed with stream: true",
    )
    completion = CompletionRequest.model_validate_json(
        json.dumps({"model": "m", "prompt": "x", "stream_options": {}})
    )
    assert completion.unsupported() is not None


def test_template_kwargs_cannot_set_the_rendering() -> None:
    assert chat(chat_template_kwargs={"enable_thinking": False}).chat_template_kwargs
    with pytest.raises(ValidationError, match="add_generation_prompt, tools"):
        chat(chat_template_kwargs={"tools": [], "add_generation_prompt": False})


def test_best_of_keeps_the_most_likely_sequences_best_first() -> None:
    sequences = [
        SequenceAnswer(index, pieces=[str(index)], log_probs=log_probs)
        for index, log_probs in enumerate([[-1.0, -2.0], [-0.5], [-4.0], [-0.1, -0.1]])
    ]
    assert [s.text for s in best_sequences(sequences, 2)] == ["3", "1"]
    assert best_sequences(sequences, 4) == sequences


def completion(prompt: Any) -> CompletionRequest:
    return CompletionRequest.model_validate_json(json.dumps({"model": "m", "prompt": prompt}))


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [
        ("The cat", ["The cat"]),
        (["a", "b"], ["a", "b"]),
        ([5, 6, 7], [[5, 6, 7]]),
        ([[5, 6], [7]], [[5, 6], [7]]),
    ],
)
def test_a_prompt_is_a_string_strings_token_ids_or_lists_of_them(
    prompt: Any, prompts: list[Any]
) -> None:
    assert completion(prompt).prompts == prompts


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "empty list"),
        (["a", " "], "prompt 1 is empty"),
        ([[1], []], "prompt 1 holds no token ids"),
        ([1, "a"], "prompt"),
        ([[1], "a"], "prompt"),
        ([True], "prompt"),
        (["x"] * 257, "at most 256"),
    ],
)
def test_malformed_prompts_are_refused_with_what_to_fix(prompt: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        completion(prompt)


async def test_models_show_the_packed_quantization(demo_tokenizer) -> None:
    """/v1/models carries the packed model's quantization (and nothing where there is none)."""
    import httpx

    from tensorrtllm_backend.serving.chat.core import ChatCore
    from tensorrtllm_backend.serving.generation import EngineLimits, Generator
    from tensorrtllm_backend.serving.openai_api.routes import build_openai_app
    from tensorrtllm_backend.triton.client import TritonLLMClient

    client = TritonLLMClient("127.0.0.1:1")  # never called: /models answers from the core
    generator = Generator(client, demo_tokenizer, EngineLimits(64, 128))
    quantization = {"algorithm": "FP8", "kv_cache": "FP8", "source": "hf_quant_config.json"}
    for packed, expected in ((quantization, quantization), (None, None)):
        app = build_openai_app(lambda packed=packed: ChatCore(generator, "m", quantization=packed))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            (card,) = (await http.get("/models")).json()["data"]
            one = (await http.get("/models/m")).json()
        assert card.get("quantization") == expected == one.get("quantization")
        assert card["id"] == "m" and card["object"] == "model"
    await client.close()
