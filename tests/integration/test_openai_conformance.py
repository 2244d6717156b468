"""What a conformance suite of the OpenAI API expects, checked against a real `bentoml serve` of
the demo model, in our own words: stream_options only with a stream, usage in every chunk when
asked (vLLM's continuous_usage_stats), max_completion_tokens, best_of ranked by cumulative log
probability, GET /v1/models/{id}, JSON error objects for unknown paths and methods, and vLLM's
/tokenize and /detokenize."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from conftest import openai_client  # tests/integration/conftest.py

if TYPE_CHECKING:
    from conftest import BentoServer

pytestmark = pytest.mark.integration

TIMEOUT = 60.0
NO_EOS = {"ignore_eos": True}  # the random demo model may end at any step otherwise
MESSAGES = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def server(demo_server: BentoServer) -> BentoServer:
    return demo_server


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_stream_options_need_a_stream(client: openai.OpenAI, model: str, path: str) -> None:
    body: dict[str, Any] = {"model": model, "stream_options": {"include_usage": True}}
    body |= {"messages": MESSAGES} if "chat" in path else {"prompt": "Once upon"}
    with pytest.raises(openai.BadRequestError) as caught:
        client.post(path, body=body, cast_to=httpx.Response)
    assert caught.value.body["param"] == "stream_options"


def test_continuous_usage_counts_every_chunk(client: openai.OpenAI, model: str) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_completion_tokens=6, stream=True,
            stream_options=options, extra_body=NO_EOS,
        )
    )  # fmt: skip
    counts = [chunk.usage.completion_tokens for chunk in chunks]
    assert all(chunk.usage is not None for chunk in chunks)
    assert counts == sorted(counts) and counts[-1] == 6
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == (
        chunks[-1].usage.prompt_tokens + 6
    )
    plain = list(
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=3, stream=True,
            stream_options={"include_usage": True}, extra_body=NO_EOS,
        )
    )  # fmt: skip
    assert [chunk.usage is not None for chunk in plain] == [False] * (len(plain) - 1) + [True]


def test_max_completion_tokens_bounds_the_answer(client: openai.OpenAI, model: str) -> None:
    answer = client.chat.completions.create(
        model=model, messages=MESSAGES, max_completion_tokens=5, extra_body=NO_EOS
    )
    assert answer.usage.completion_tokens == 5 and answer.choices[0].finish_reason == "length"


def test_best_of_answers_the_most_likely_sequences(client: openai.OpenAI, model: str) -> None:
    """The same seed gives the same candidates: best_of answers those of highest cumulative log
    probability among the n=best_of sequences, and bills all of them."""
    common = {"model": model, "prompt": "Once upon", "max_tokens": 6, "seed": 11}
    every = client.completions.create(n=4, logprobs=0, extra_body=NO_EOS, **common)
    totals = sorted((sum(c.logprobs.token_logprobs), c.text) for c in every.choices)
    best = client.completions.create(n=2, best_of=4, extra_body=NO_EOS, **common)
    assert [choice.text for choice in best.choices] == [text for _, text in totals[::-1][:2]]
    assert [choice.index for choice in best.choices] == [0, 1]
    assert all(choice.logprobs is None for choice in best.choices)  # not asked for
    assert best.usage.completion_tokens == every.usage.completion_tokens == 24
    for refused in ({"n": 2, "best_of": 1}, {"best_of": 3, "stream": True}):
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(**{**common, **refused})
        assert caught.value.body["param"] == "best_of"


def test_best_of_is_not_a_chat_field(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=MESSAGES, extra_body={"best_of": 2})
    assert caught.value.body["param"] == "best_of"


def test_a_model_is_found_by_its_id(client: openai.OpenAI, model: str) -> None:
    card = client.models.retrieve(model)
    assert card.id == model and card.object == "model"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no-such-model")
    assert caught.value.body["code"] == "model_not_found"


def test_unknown_paths_and_methods_answer_error_objects(demo_server: BentoServer) -> None:
    missing = httpx.post(f"{demo_server.url}/v1/no/such/path", json={}, timeout=TIMEOUT)
    assert missing.status_code == 404
    assert "does not exist" in missing.json()["error"]["message"]
    wrong = httpx.get(f"{demo_server.url}/v1/chat/completions", timeout=TIMEOUT)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["type"] == "invalid_request_error"


def test_tokenize_and_detokenize_speak_vllms_shapes(demo_server: BentoServer, model: str) -> None:
    url = demo_server.url
    tokens = httpx.post(
        f"{url}/tokenize", json={"prompt": "Once upon a time", "return_token_strs": True},
        timeout=TIMEOUT,
    ).json()  # fmt: skip
    assert tokens["count"] == len(tokens["tokens"]) == len(tokens["token_strs"])
    assert tokens["token_strs"][0] == "<s>" and tokens["max_model_len"] > tokens["count"]
    text = httpx.post(
        f"{url}/detokenize", json={"model": model, "tokens": tokens["tokens"]}, timeout=TIMEOUT
    ).json()
    assert text == {"prompt": "<s>Once upon a time"}
    chat = httpx.post(f"{url}/tokenize", json={"messages": MESSAGES}, timeout=TIMEOUT).json()
    prompt = openai_client(demo_server, TIMEOUT).chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=1
    )
    assert chat["count"] == prompt.usage.prompt_tokens and chat["token_strs"] is None
    for body, param in [
        ({"prompt": "x", "messages": MESSAGES}, None),
        ({"tokens": [10**9]}, "tokens"),
        ({"prompt": "x", "model": "no-such-model"}, "model"),
    ]:
        path = "/detokenize" if "tokens" in body else "/tokenize"
        refused = httpx.post(f"{url}{path}", json=body, timeout=TIMEOUT)
        assert refused.status_code in (400, 404), refused.text
        assert refused.json()["error"]["param"] == param
