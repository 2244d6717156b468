"""Evaluation-grade completions through the official `openai` client, on both token-id routes
(`direct`: the CPU engine's context logits reduced by the prompt_logprobs model beside it;
`llmapi`: our LLM-API model on its CPU stand-in): token-id and batched prompts, and the prompt
tokens' log probs under echo, equal to transformers' on the demo checkpoint."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
import torch

from tests.integration.conftest import BentoServer, openai_client

pytestmark = pytest.mark.timeout(600)

TOLERANCE = 1e-3  # float32 on the CPU, two forward implementations


@pytest.fixture(scope="module")
def server(route_server):
    return route_server


@pytest.fixture(scope="module")
def reference(demo_checkpoint: Path):
    """log_softmax of the demo checkpoint's logits for a prompt, by transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(demo_checkpoint), dtype=torch.float32)
    model.eval()

    def log_probs(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0]
        return torch.log_softmax(logits.float(), dim=-1)

    return log_probs


@pytest.fixture(scope="module")
def prompts(demo_tokenizer) -> list[list[int]]:
    texts = ["The cat sat on the mat because", "Paris is the capital of", "One two three"]
    return [list(demo_tokenizer.encode(text)) for text in texts]


def expected_prompt_log_probs(reference, ids: list[int]) -> list[float]:
    table = reference(ids)
    return [table[t, ids[t + 1]].item() for t in range(len(ids) - 1)]


def check_echoed_prompt(choice, ids: list[int], reference, k: int) -> None:
    """The choice's log probs open with the prompt's: null first, then transformers' values;
    each position's alternatives hold the k most likely and the prompt's own token."""
    logprobs = choice.logprobs
    values = logprobs.token_logprobs[: len(ids)]
    assert values[0] is None and logprobs.top_logprobs[0] is None
    expected = expected_prompt_log_probs(reference, ids)
    assert values[1:] == pytest.approx(expected, abs=TOLERANCE)
    table = reference(ids)
    for position in range(1, len(ids)):
        top = logprobs.top_logprobs[position]
        best = torch.topk(table[position - 1], k).values.tolist()
        assert max(top.values()) == pytest.approx(best[0], abs=TOLERANCE)
        assert logprobs.tokens[position] in top
    # text_offset points into the echoed text: each token's own text starts there (the BOS,
    # which the text does not show, takes no room).
    offsets = logprobs.text_offset[: len(ids)]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    for position, token in enumerate(logprobs.tokens[: len(ids)]):
        if position == 0 and token == "<s>":
            assert offsets[1] == 0
            continue
        assert choice.text.startswith(token, offsets[position]), (position, token)


def test_token_id_prompt_echo_logprobs_are_the_models(client, model, prompts, reference) -> None:
    ids = prompts[0]
    completion = client.completions.create(
        model=model, prompt=ids, echo=True, logprobs=2, max_tokens=1, temperature=0
    )
    (choice,) = completion.choices
    check_echoed_prompt(choice, ids, reference, 2)
    assert len(choice.logprobs.token_logprobs) == len(ids) + 1  # the generated token last
    assert completion.usage.prompt_tokens == len(ids)
    assert completion.usage.completion_tokens == 1


def test_max_tokens_zero_scores_without_generating(client, model, prompts, reference) -> None:
    ids = prompts[1]
    completion = client.completions.create(
        model=model, prompt=ids, echo=True, logprobs=1, max_tokens=0
    )
    (choice,) = completion.choices
    assert len(choice.logprobs.token_logprobs) == len(ids)
    check_echoed_prompt(choice, ids, reference, 1)
    assert choice.finish_reason == "length" and completion.usage.completion_tokens == 0


def test_a_batch_answers_prompt_major_with_usage_summed(
    client, model, prompts, demo_tokenizer, reference
) -> None:
    completion = client.completions.create(
        model=model, prompt=prompts, echo=True, logprobs=1, max_tokens=2, n=2, temperature=0
    )
    assert [choice.index for choice in completion.choices] == list(range(6))
    for index, choice in enumerate(completion.choices):
        ids = prompts[index // 2]
        assert choice.text.startswith(demo_tokenizer.decode(ids, skip_special_tokens=True))
        check_echoed_prompt(choice, ids, reference, 1)
    assert completion.usage.prompt_tokens == sum(len(ids) for ids in prompts)
    assert completion.usage.completion_tokens == 12


def test_string_prompts_batch_like_token_ids(client, model) -> None:
    texts = ["Hello there", "The weather is"]
    batch = client.completions.create(model=model, prompt=texts, max_tokens=4, temperature=0)
    one_by_one = [
        client.completions.create(model=model, prompt=text, max_tokens=4, temperature=0)
        for text in texts
    ]
    assert [c.text for c in batch.choices] == [o.choices[0].text for o in one_by_one]


def test_streamed_echo_scores_equal_the_whole_answer(client, model, prompts) -> None:
    whole = client.completions.create(
        model=model, prompt=prompts[:2], echo=True, logprobs=2, max_tokens=3, temperature=0
    )
    texts: dict[int, str] = {}
    values: dict[int, list] = {}
    offsets: dict[int, list] = {}
    finishes: dict[int, str | None] = {}
    for chunk in client.completions.create(
        model=model, prompt=prompts[:2], echo=True, logprobs=2, max_tokens=3, temperature=0,
        stream=True,
    ):  # fmt: skip
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.logprobs is not None:
                values.setdefault(choice.index, []).extend(choice.logprobs.token_logprobs)
                offsets.setdefault(choice.index, []).extend(choice.logprobs.text_offset)
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    for choice in whole.choices:
        assert texts[choice.index] == choice.text
        # Equal up to float32 rounding: the two ran in batches of other compositions.
        streamed, whole_values = values[choice.index], choice.logprobs.token_logprobs
        assert streamed[0] is None and whole_values[0] is None
        assert streamed[1:] == pytest.approx(whole_values[1:], abs=1e-5)
        assert offsets[choice.index] == choice.logprobs.text_offset
        assert finishes[choice.index] == choice.finish_reason


def test_vllm_prompt_logprobs_per_choice(server, model, prompts, reference) -> None:
    ids = prompts[2]
    body = {"model": model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 2}
    answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).json()
    entries = answer["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    table = reference(ids)
    for position in range(1, len(ids)):
        entry = entries[position]
        own = entry[str(ids[position])]
        assert own["logprob"] == pytest.approx(
            table[position - 1, ids[position]].item(), abs=TOLERANCE
        )
        rank = 1 + int((table[position - 1] > table[position - 1, ids[position]]).sum())
        assert own["rank"] == rank
        assert 2 <= len(entry) <= 3 and all(math.isfinite(e["logprob"]) for e in entry.values())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": [1, 10_000_000]}, "outside the vocabulary"),
        ({"prompt": [[1, 2], [1, 10_000_000]]}, "prompt 1: prompt holds token id 10000000"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens 0 generates nothing"),
        ({"prompt": "x", "prompt_logprobs": 1, "stream": True}, "not streamed"),
        ({"prompt": [[1, 2]] * 300}, "at most 256"),
        ({"prompt": [[1, 2], [1] * 300]}, "prompt 1: prompt is 300 tokens"),
        # 256 prompts x 240 tokens x (20 alternatives + 1): more entries than one answer holds
        ({"prompt": [[1] * 240] * 256, "prompt_logprobs": 20}, "more than 1048576 per request"),
    ],
)
def test_bad_batches_and_scores_are_400s_that_say_what_to_fix(
    server, model, fields: dict, message: str
) -> None:
    response = httpx.post(
        f"{server.url}/v1/completions", json={"model": model, **fields}, timeout=60
    )
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]


@pytest.mark.parametrize("route", ["bls", "ensemble"])
def test_loglikelihood_where_the_generation_returns_no_alternatives(
    route: str, demo_server: BentoServer, text_route: Callable[[str], BentoServer]
) -> None:
    """lm-evaluation-harness's loglikelihood request on a route whose generation returns the
    chosen token's log prob only: the prompt's alternatives and the generated token's come
    from the scorer (the generated token's from the context logits' last row), equal to the
    direct route's, whose engine returns them itself."""
    body = {
        "model": "trtllm-demo", "prompt": "The cat sat on the mat because", "echo": True,
        "logprobs": 1, "max_tokens": 1, "temperature": 0,
    }  # fmt: skip
    expected = httpx.post(f"{demo_server.url}/v1/completions", json=body, timeout=120)
    assert expected.status_code == 200, expected.text
    served = text_route(route)
    answer = httpx.post(f"{served.url}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    (want,), (got,) = expected.json()["choices"], answer.json()["choices"]
    assert got["text"] == want["text"]
    got_logprobs, want_logprobs = got["logprobs"], want["logprobs"]
    assert got_logprobs["tokens"] == want_logprobs["tokens"]
    assert got_logprobs["token_logprobs"][0] is None
    assert got_logprobs["token_logprobs"][1:] == pytest.approx(
        want_logprobs["token_logprobs"][1:], abs=TOLERANCE
    )
    for got_top, want_top in zip(
        got_logprobs["top_logprobs"][1:], want_logprobs["top_logprobs"][1:], strict=True
    ):
        assert got_top.keys() == want_top.keys()
        assert list(got_top.values()) == pytest.approx(list(want_top.values()), abs=TOLERANCE)
    generated = got_logprobs["top_logprobs"][-1]
    assert len(generated) == 1 and got_logprobs["tokens"][-1] in generated  # greedy: the best
    streamed = [
        choice["logprobs"]["top_logprobs"]
        for chunk in sse_events(served.url, {**body, "stream": True})
        for choice in chunk["choices"]
        if choice["logprobs"] is not None
    ]
    (streamed_top,) = streamed[-1]  # the generated token's, from another scoring request
    assert streamed_top.keys() == generated.keys()
    assert list(streamed_top.values()) == pytest.approx(list(generated.values()), abs=1e-5)
    refused = httpx.post(f"{served.url}/v1/completions", json={**body, "max_tokens": 2}, timeout=60)
    assert refused.status_code == 400, refused.text
    assert "with echo and max_tokens 1" in refused.json()["error"]["message"]


def sse_events(url: str, body: dict) -> list[dict]:
    """The JSON events of a streamed /v1/completions answer."""
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        lines = [line[len("data: ") :] for line in response.iter_lines() if line]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_the_official_client_streams_a_token_batch(server, model, prompts) -> None:
    client = openai_client(server, 120.0)
    assert isinstance(client, openai.OpenAI)
    seen = set()
    for chunk in client.completions.create(
        model=model, prompt=prompts, max_tokens=2, stream=True, temperature=0
    ):
        seen.update(choice.index for choice in chunk.choices)
    assert seen == {0, 1, 2}


def test_chat_prompt_logprobs_score_the_rendered_prompt(server, model, demo_tokenizer, reference):
    messages = [{"role": "user", "content": "Name a colour."}]
    body = {"model": model, "messages": messages, "max_tokens": 2, "prompt_logprobs": 0}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120).json()
    rendered = demo_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    ids = list(demo_tokenizer.encode(rendered, add_special_tokens=False))  # as chat sends it
    entries = answer["prompt_logprobs"]
    assert len(entries) == len(ids) == answer["usage"]["prompt_tokens"]
    expected = expected_prompt_log_probs(reference, ids)
    got = [entries[t][str(ids[t])]["logprob"] for t in range(1, len(ids))]
    assert got == pytest.approx(expected, abs=TOLERANCE)
    streamed = httpx.post(
        f"{server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=60
    )
    assert streamed.status_code == 400 and "not streamed" in streamed.text
