"""The OpenAI request models' own rules: stream_options only with a stream and how a stream
reports usage, chat_template_kwargs limited to the template's variables, best_of's ranking."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from tensorrtllm_backend.serving.chat.request import UsageReport
from tensorrtllm_backend.serving.chat.stream import SequenceAnswer
from tensorrtllm_backend.serving.openai_api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)
from tensorrtllm_backend.serving.openai_api.serving import best_sequences


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


async def test_echo_with_logprobs_is_refused_not_answered_with_the_wrong_numbers(
    demo_tokenizer,
) -> None:
    """Prompt log probs are not computed: lm-evaluation-harness's loglikelihood requests (echo,
    logprobs, max_tokens 1) get a 400, not generated tokens' log probs under an echoed prompt."""
    from tensorrtllm_backend.serving.chat.core import ChatCore
    from tensorrtllm_backend.serving.generation import EngineLimits, Generator
    from tensorrtllm_backend.serving.openai_api.serving import OpenAIServing
    from tensorrtllm_backend.serving.request_errors import RequestError
    from tensorrtllm_backend.triton.client import TritonLLMClient

    client = TritonLLMClient.__new__(TritonLLMClient)  # never called: refused before
    serving = OpenAIServing(ChatCore(Generator(client, demo_tokenizer, EngineLimits(64, 128)), "m"))
    request = CompletionRequest.model_validate(
        {"model": "m", "prompt": "The cat", "echo": True, "logprobs": 1, "max_tokens": 1}
    )
    with pytest.raises(RequestError, match="prompt tokens' log probs") as refused:
        await serving.prepare_completion(request)
    assert refused.value.param == "echo" and refused.value.status == 400
