"""The OpenAI-compatible API driven by the official `openai` client, sync and async,
against a real `bentoml serve` of the demo model on each token-id route (`direct`: the CPU engine
in tensorrt_llm; `llmapi`: our LLM-API model on its CPU stand-in); plus checks that each native
sampling parameter reaches the engine, observed on the output of the real (hf-mode) engine."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bentoml
import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.integration.conftest import openai_client

if TYPE_CHECKING:
    from conftest import BentoServer  # tests/integration/conftest.py

pytestmark = pytest.mark.integration

PROMPT = "Once upon a time"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me a story about a cat."},
]
TIMEOUT = 60.0
NO_EOS = {"ignore_eos": True}  # the random demo model may emit its end token at any step


@pytest.fixture(scope="module")
def server(route_server: BentoServer) -> BentoServer:
    return route_server


@cache
def _tokenizer(tag: str) -> Any:
    return AutoTokenizer.from_pretrained(Path(bentoml.models.get(tag).path) / "tokenizer")


@pytest.fixture(scope="module")
def tokenizer(demo_model: str) -> Any:
    return _tokenizer(demo_model)


def native(server: BentoServer, **fields: Any) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/generate_text", json=fields, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()


def greedy_completion(client: openai.OpenAI, model: str, max_tokens: int = 24) -> Any:
    return client.completions.create(
        model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=0, logprobs=1,
        extra_body=NO_EOS,
    )  # fmt: skip


def clean_piece(text: str, start: int, size: int = 3) -> str:
    """A substring of `text` at or after `start` with no replacement char and no blank."""
    for i in range(start, len(text) - size):
        piece = text[i : i + size]
        if "\ufffd" not in piece and piece.strip() == piece and piece.isprintable():
            return piece
    pytest.skip("the greedy output has no clean substring to use as a stop string")


# --- models ----------------------------------------------------------------------------------------


def test_models_lists_the_served_model(demo_server: BentoServer, demo_model: str) -> None:
    models = openai_client(demo_server, TIMEOUT).models.list().data
    assert [m.id for m in models] == [demo_model.split(":")[0]]
    assert models[0].object == "model"


# --- completions -----------------------------------------------------------------------------------


def test_completion_has_usage_and_length_finish(client: openai.OpenAI, model: str) -> None:
    result = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=9, temperature=0, extra_body=NO_EOS
    )
    choice = result.choices[0]
    assert result.object == "text_completion" and choice.text
    assert choice.finish_reason == "length"
    assert result.usage is not None
    assert result.usage.completion_tokens == 9
    assert result.usage.total_tokens == result.usage.prompt_tokens + 9


def test_streamed_completion_equals_the_non_streamed_one(client: openai.OpenAI, model: str) -> None:
    whole = greedy_completion(client, model, 16).choices[0].text
    chunks = list(
        client.completions.create(
            model=model, prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
            extra_body=NO_EOS,
        )
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completion_logprobs_one_per_token(client: openai.OpenAI, model: str) -> None:
    result = greedy_completion(client, model, 12)
    logprobs = result.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None
    assert len(logprobs.token_logprobs) == result.usage.completion_tokens == 12
    assert len(logprobs.tokens) == 12
    assert all(lp <= 0.0 for lp in logprobs.token_logprobs)


@pytest.mark.parametrize("as_list", [False, True], ids=["string", "list"])
def test_stop_is_cut_and_not_returned(client: openai.OpenAI, model: str, as_list: bool) -> None:
    text = greedy_completion(client, model, 30).choices[0].text
    stop = clean_piece(text, len(text) // 3)
    expected = text[: text.index(stop)]
    result = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=30, temperature=0, extra_body=NO_EOS,
        stop=[stop, "never-seen-stop"] if as_list else stop,
    )  # fmt: skip
    assert result.choices[0].text == expected
    assert stop not in result.choices[0].text
    assert result.choices[0].finish_reason == "stop"


def _openai_samples(client: openai.OpenAI, model: str, seeds: list[int], **extra: Any) -> list[str]:
    return [
        client.completions.create(
            model=model, prompt=PROMPT, max_tokens=16, temperature=0.8, seed=seed,
            extra_body=NO_EOS, **extra,
        ).choices[0].text
        for seed in seeds
    ]  # fmt: skip


def test_seed_reproducibility_with_top_p(client: openai.OpenAI, model: str) -> None:
    first, again, *others = _openai_samples(client, model, [1234, 1234, 1, 2, 3], top_p=0.95)
    assert again == first
    assert any(text != first for text in others), "different seeds gave the same text 3 times"


def test_temperature_alone_samples(client: openai.OpenAI, model: str) -> None:
    """OpenAI semantics: temperature 0.8 with top_p left at its default (1.0) samples. Sending no
    top_k/top_p to TensorRT-LLM means greedy, so the adapter has to send top_p=1 itself."""
    first, again, *others = _openai_samples(client, model, [1234, 1234, 1, 2, 3])
    assert again == first
    greedy = greedy_completion(client, model, 16).choices[0].text
    assert any(text != first for text in others) and first != greedy, (
        "temperature 0.8 without top_p gave the greedy text for every seed"
    )


def test_unseeded_sampling_varies_between_requests(client: openai.OpenAI, model: str) -> None:
    """OpenAI semantics: no seed means a fresh one per request (TensorRT-LLM's default seed 0
    would repeat the same text for every unseeded request)."""
    texts = {
        client.completions.create(
            model=model, prompt=PROMPT, max_tokens=16, temperature=0.8, extra_body=NO_EOS
        )
        .choices[0]
        .text
        for _ in range(4)
    }
    assert len(texts) > 1, texts


def test_raw_sse_stream_ends_with_done(route_server: BentoServer, model: str) -> None:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 6, "stream": True, **NO_EOS}
    with httpx.stream(
        "POST", f"{route_server.url}/v1/completions", json=body, timeout=TIMEOUT
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert len({e["id"] for e in events}) == 1
    assert events[-1]["choices"][0]["finish_reason"] == "length"


# --- chat --------------------------------------------------------------------------------------


def test_chat_uses_the_tokenizers_template(client: openai.OpenAI, model: str, tokenizer) -> None:
    result = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=5, temperature=0
    )
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    expected = len(tokenizer.encode(rendered, add_special_tokens=False))
    assert result.usage.prompt_tokens == expected
    # and that is not what the raw text of the messages would give
    plain = len(tokenizer.encode(" ".join(m["content"] for m in MESSAGES)))
    assert expected != plain
    assert result.choices[0].message.role == "assistant"


def test_chat_max_completion_tokens_and_max_tokens(client: openai.OpenAI, model: str) -> None:
    for limit in ({"max_completion_tokens": 7}, {"max_tokens": 4}):
        result = client.chat.completions.create(
            model=model, messages=MESSAGES, temperature=0, extra_body=NO_EOS, **limit
        )
        (expected,) = limit.values()
        assert result.usage.completion_tokens == expected, limit
        assert result.choices[0].finish_reason == "length"


def test_chat_logprobs_one_per_token(client: openai.OpenAI, model: str) -> None:
    result = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True,
        extra_body=NO_EOS,
    )  # fmt: skip
    content = result.choices[0].logprobs.content
    assert len(content) == result.usage.completion_tokens == 8
    assert all(item.logprob <= 0.0 for item in content)


def test_chat_stream_include_usage(client: openai.OpenAI, model: str) -> None:
    chunks = list(
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=6, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body=NO_EOS,
        )
    )  # fmt: skip
    *content_chunks, usage_chunk = chunks
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 6
    assert all(c.usage is None for c in content_chunks)
    text = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    whole = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=6, temperature=0, extra_body=NO_EOS
    )
    assert text == whole.choices[0].message.content
    assert whole.usage.prompt_tokens == usage_chunk.usage.prompt_tokens


def test_chat_stream_without_usage_has_no_usage_chunk(client: openai.OpenAI, model: str) -> None:
    chunks = list(
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=3, stream=True, extra_body=NO_EOS
        )
    )
    assert all(c.usage is None and c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_async_client_chat_and_completion(async_client: openai.AsyncOpenAI, model) -> None:
    async with async_client:
        result = await async_client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=5, temperature=0, extra_body=NO_EOS
        )
        assert result.usage.completion_tokens == 5
        stream = await async_client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=5, temperature=0, stream=True,
            extra_body=NO_EOS,
        )  # fmt: skip
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == result.choices[0].message.content
        completion = await async_client.completions.create(
            model=model, prompt=PROMPT, max_tokens=4, stream=True, extra_body=NO_EOS
        )
        finishes = [c.choices[0].finish_reason async for c in completion if c.choices]
        assert finishes[-1] == "length"


# --- errors --------------------------------------------------------------------------------------


def test_chat_top_logprobs_are_the_alternatives_streamed_and_not(
    client: openai.OpenAI, model: str
) -> None:
    fields: dict[str, Any] = dict(
        model=model, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=2, extra_body=NO_EOS,
    )  # fmt: skip
    whole = client.chat.completions.create(**fields)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 6
    for item in content:
        first, second = item.top_logprobs  # exactly two
        assert first.token == item.token and first.logprob == pytest.approx(item.logprob)  # greedy
        assert 0.0 >= first.logprob >= second.logprob
        assert first.bytes == list(first.token.encode())
    chunks = list(
        client.chat.completions.create(
            **fields, stream=True, stream_options={"include_usage": True}
        )
    )
    streamed = [
        item
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs
        for item in chunk.choices[0].logprobs.content
    ]
    assert [(i.token, [t.token for t in i.top_logprobs]) for i in streamed] == [
        (i.token, [t.token for t in i.top_logprobs]) for i in content
    ]
    assert chunks[-1].usage.completion_tokens == len(streamed)  # usage counts what streamed


def test_completion_logprobs_k_in_the_legacy_shape(client: openai.OpenAI, model: str) -> None:
    fields: dict[str, Any] = dict(
        model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2, extra_body=NO_EOS
    )
    whole = client.completions.create(**fields)
    logprobs = whole.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    offsets = [sum(len(t) for t in logprobs.tokens[:i]) for i in range(5)]
    assert logprobs.text_offset == offsets
    for token, log_prob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        # Two alternatives, keyed by their text (OpenAI's shape merges two that print alike).
        assert len(top) == 2 or "\ufffd" in "".join(top)
        assert top[token] == pytest.approx(log_prob) == max(top.values())  # greedy
    streamed = [
        chunk.choices[0].logprobs
        for chunk in client.completions.create(**fields, stream=True)
        if chunk.choices and chunk.choices[0].logprobs
    ]
    assert [t for lp in streamed for t in lp.tokens] == logprobs.tokens
    assert [o for lp in streamed for o in lp.text_offset] == offsets
    assert [t for lp in streamed for t in lp.top_logprobs] == logprobs.top_logprobs


def test_top_logprobs_without_logprobs_is_400(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs") as caught:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, top_logprobs=2)
    assert caught.value.param == "top_logprobs"


def _sample(client: openai.OpenAI, model: str, seed: int) -> str:
    return _openai_samples(client, model, [seed])[0]


def test_completion_n_returns_one_sampled_choice_per_sequence(
    client: openai.OpenAI, model: str
) -> None:
    """n=3 is one engine request with num_return_sequences=3; sequence i samples with seed + i,
    so choice i equals a lone request with that seed."""
    result = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=16, temperature=0.8, seed=1234, n=3,
        logprobs=1, extra_body=NO_EOS,
    )  # fmt: skip
    assert [choice.index for choice in result.choices] == [0, 1, 2]
    texts = [choice.text for choice in result.choices]
    assert texts == [_sample(client, model, 1234 + i) for i in range(3)]
    assert len(set(texts)) == 3, texts
    assert all(choice.finish_reason == "length" for choice in result.choices)
    assert all(len(choice.logprobs.token_logprobs) == 16 for choice in result.choices)
    assert result.usage.completion_tokens == 3 * 16


def test_streamed_n_interleaves_choices_that_equal_the_whole_answer(
    client: openai.OpenAI, model: str
) -> None:
    fields: dict[str, Any] = dict(
        model=model, prompt=PROMPT, max_tokens=16, temperature=0.8, seed=99, n=2,
        extra_body=NO_EOS,
    )  # fmt: skip
    whole = client.completions.create(**fields)
    texts: dict[int, str] = {0: "", 1: ""}
    finishes: dict[int, str | None] = {}
    usage = None
    for chunk in client.completions.create(
        **fields, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    assert [texts[0], texts[1]] == [choice.text for choice in whole.choices]
    assert finishes == {0: "length", 1: "length"}
    assert usage is not None and usage.completion_tokens == 32


def test_chat_n_streams_a_role_then_content_per_choice(client: openai.OpenAI, model: str) -> None:
    fields: dict[str, Any] = dict(
        model=model, messages=MESSAGES, max_tokens=8, temperature=0.8, seed=5, n=2,
        extra_body=NO_EOS,
    )  # fmt: skip
    whole = client.chat.completions.create(**fields)
    assert [choice.index for choice in whole.choices] == [0, 1]
    assert whole.usage.completion_tokens == 16
    roles: dict[int, int] = {}
    contents: dict[int, str] = {0: "", 1: ""}
    for chunk in client.chat.completions.create(**fields, stream=True):
        for choice in chunk.choices:
            if choice.delta.role is not None:
                assert contents[choice.index] == "", "the role comes before the content"
                roles[choice.index] = roles.get(choice.index, 0) + 1
            contents[choice.index] += choice.delta.content or ""
    assert roles == {0: 1, 1: 1}
    assert [contents[0], contents[1]] == [c.message.content for c in whole.choices]


def test_greedy_n_gives_identical_choices(client: openai.OpenAI, model: str) -> None:
    """As on TensorRT-LLM: without sampling, every sequence is the greedy one."""
    result = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, n=2, extra_body=NO_EOS
    )
    assert result.choices[0].text == result.choices[1].text
    assert result.choices[0].text == greedy_completion(client, model, 12).choices[0].text


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=2)
    assert caught.value.code == "model_not_found"
    assert "no-such-model" in caught.value.message


def test_too_long_prompt_is_context_length_exceeded(client: openai.OpenAI, model: str) -> None:
    long_prompt = "story " * 2000  # far beyond the demo's max_input_len of 256 tokens
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt=long_prompt, max_tokens=2)
    assert caught.value.code == "context_length_exceeded"
    assert "max_input_len" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": long_prompt}], max_tokens=2
        )
    assert caught.value.code == "context_length_exceeded"


# --- native parameters reach the engine (observed on the hf engine's output) ----------------------


def test_native_greedy_is_deterministic_and_equals_openai(
    route_server: BentoServer, client: openai.OpenAI, model: str
) -> None:
    first = native(route_server, prompt=PROMPT, max_tokens=16, temperature=0.0, ignore_eos=True)
    second = native(route_server, prompt=PROMPT, max_tokens=16, temperature=0.0, ignore_eos=True)
    assert first["text"] == second["text"]
    assert first["text"] == greedy_completion(client, model, 16).choices[0].text


def test_native_seed_reproducibility(route_server: BentoServer) -> None:
    def sample(seed: int) -> str:
        return native(
            route_server, prompt=PROMPT, max_tokens=16, temperature=0.8, top_k=50, seed=seed,
            ignore_eos=True,
        )["text"]  # fmt: skip

    first = sample(7)
    assert sample(7) == first
    assert any(sample(seed) != first for seed in (8, 9, 10))


def test_native_num_return_sequences(route_server: BentoServer) -> None:
    fields: dict[str, Any] = dict(
        prompt=PROMPT, max_tokens=12, temperature=0.8, top_k=50, seed=21, ignore_eos=True,
        return_log_probs=True,
    )  # fmt: skip
    result = native(route_server, **fields, num_return_sequences=3)
    sequences = result["sequences"]
    assert [s["index"] for s in sequences] == [0, 1, 2]
    lone = [native(route_server, **{**fields, "seed": 21 + i})["text"] for i in range(3)]
    assert [s["text"] for s in sequences] == lone
    assert result["text"] == lone[0]
    assert all(s["completion_tokens"] == 12 and len(s["log_probs"]) == 12 for s in sequences)
    assert result["usage"]["completion_tokens"] == 36
    assert "sequences" not in native(route_server, **fields)


def test_native_top_p_and_temperature_reach_the_engine(route_server: BentoServer) -> None:
    base = {"prompt": PROMPT, "max_tokens": 16, "ignore_eos": True, "seed": 3}
    greedy = native(route_server, **base, temperature=0.0)["text"]
    sampled = native(route_server, **base, temperature=1.0, top_p=0.99)["text"]
    assert sampled != greedy
    # a tiny nucleus keeps only the most likely token: greedy again, whatever the seed
    assert native(route_server, **base, temperature=1.0, top_p=1e-6)["text"] == greedy


def test_native_bad_words_are_not_generated(
    route_server: BentoServer, client: openai.OpenAI, model: str
) -> None:
    greedy = greedy_completion(client, model, 20).choices[0]
    words = [t for t in greedy.logprobs.tokens if t.strip().isalpha() and len(t.strip()) >= 3]
    if not words:
        pytest.skip("the greedy output has no whole-word token to ban")
    banned = words[0].strip()
    assert banned in greedy.text
    result = native(
        route_server, prompt=PROMPT, max_tokens=20, temperature=0.0, ignore_eos=True,
        bad_words=[banned, words[0]],
    )  # fmt: skip
    assert result["text"] != greedy.text
    assert banned not in result["text"]


def test_native_min_tokens_overrides_an_early_end(
    route_server: BentoServer, client: openai.OpenAI, model: str, tokenizer
) -> None:
    """Make one of the first greedy tokens the end token: without min_tokens the answer ends
    there, with min_tokens=8 it runs on to max_tokens."""
    tokens = greedy_completion(client, model, 6).choices[0].logprobs.tokens
    single = [
        (position, ids)
        for position, ids in enumerate(
            tokenizer.encode(t, add_special_tokens=False) for t in tokens
        )
        if len(ids) == 1
    ]
    if not single:
        pytest.skip(f"no greedy token of {tokens!r} re-encodes to one id")
    position, ids = single[0]
    base = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0.0, "end_id": ids[0]}
    ended = native(route_server, **base)
    assert ended["finish_reason"] == "stop"
    assert ended["usage"]["completion_tokens"] <= position + 1
    forced = native(route_server, **base, min_tokens=8)
    assert forced["usage"]["completion_tokens"] == 8
    assert forced["finish_reason"] == "length"


def test_native_repetition_penalty_changes_greedy_output(route_server: BentoServer) -> None:
    base = {"prompt": PROMPT, "max_tokens": 30, "temperature": 0.0, "ignore_eos": True}
    plain = native(route_server, **base)["text"]
    penalized = native(route_server, **base, repetition_penalty=1.5)["text"]
    assert penalized != plain


def test_native_exclude_input_in_output_false_prefixes_the_prompt(route_server) -> None:
    base = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0.0, "ignore_eos": True}
    without = native(route_server, **base)["text"]
    with_prompt = native(route_server, **base, exclude_input_in_output=False)["text"]
    assert with_prompt == PROMPT + without


def test_native_return_log_probs(route_server: BentoServer) -> None:
    result = native(
        route_server, prompt=PROMPT, max_tokens=6, temperature=0.0, ignore_eos=True,
        return_log_probs=True,
    )  # fmt: skip
    assert len(result["log_probs"]) == result["usage"]["completion_tokens"] == 6
    assert result["cum_log_prob"] == pytest.approx(sum(result["log_probs"]))


def test_native_top_log_probs(route_server: BentoServer) -> None:
    result = native(
        route_server, prompt=PROMPT, max_tokens=4, temperature=0.0, ignore_eos=True,
        return_log_probs=True, top_log_probs=3,
    )  # fmt: skip
    assert len(result["top_log_probs"]) == len(result["log_probs"]) == 4
    for log_prob, top in zip(result["log_probs"], result["top_log_probs"], strict=True):
        assert len(top) == 3 and top[0]["log_prob"] == pytest.approx(log_prob)
        assert {"token_id", "token", "log_prob"} == set(top[0])
