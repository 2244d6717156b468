"""Reasoning through a real `bentoml serve` of a model that thinks (tests/thinking_model.py: the
demo tokenizer with `<think>` tokens, a chat template whose generation prompt opens a think block,
and a Llama wired to write a fixed thinking, `</think>` and a fixed answer), on the real hf engine
with its real xgrammar masking.

What it proves:

* the split: chat answers carry the thinking as `reasoning_content` and `reasoning` and the answer
  as `content`, whole and streamed; Responses has a reasoning item, Messages a thinking block;
  `chat_template_kwargs` (`enable_thinking: false`) reach the template and the model answers
  without thinking;
* structured output after reasoning: the thinking contains `{is it]`, which no JSON grammar
  allows. With a response_format or a forced tool call, the thinking comes back exactly as the
  model wrote it (the grammar let it run free) and the answer after it is valid under the schema,
  where the model on its own would have written plain text. The same schema enforced from the
  first token (the native API, which knows nothing of reasoning) changes the first token already.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import jsonschema
import openai
import pytest
from conftest import pack  # tests/integration/conftest.py

from tests.thinking_model import (
    ANSWER,
    MESSAGES,
    THINKING,
    build_thinking_checkpoint,
    thinking_tokenizer,
)

if TYPE_CHECKING:
    from conftest import BentoServer

pytestmark = pytest.mark.integration

TIMEOUT = 120.0
OK = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
GREEDY = {"temperature": 0, "max_tokens": 80}


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    checkpoint = build_thinking_checkpoint(tmp_path_factory.mktemp("thinking") / "checkpoint")
    return pack(
        "--hf-model", str(checkpoint), "--name", "trtllm-thinking",
        "--max-input-len", "512", "--max-seq-len", "768",
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(thinking_model: str, module_bento_launcher) -> BentoServer:
    # No TRTLLM_REASONING_PARSER: the format is read from the chat template (qwen3).
    return module_bento_launcher(thinking_model, wait=True)


def chat(client: openai.OpenAI, **fields: Any) -> Any:
    return client.chat.completions.create(
        model="trtllm-thinking", messages=MESSAGES, **{**GREEDY, **fields}
    )


def streamed(client: openai.OpenAI, **fields: Any) -> tuple[str, str, str | None]:
    """(reasoning, content, finish reason) of a streamed chat answer, from its deltas."""
    thinking, content, finish = [], [], None
    for chunk in chat(client, stream=True, **fields):
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            assert delta.get("reasoning") == delta.get("reasoning_content")
            thinking.append(delta.get("reasoning") or "")
            content.append(delta.get("content") or "")
            finish = choice.finish_reason or finish
    return "".join(thinking), "".join(content), finish


def test_chat_splits_the_thinking_from_the_answer(client: openai.OpenAI) -> None:
    message = chat(client).choices[0].message.model_dump()
    assert message["reasoning_content"] == message["reasoning"] == THINKING
    assert message["content"] == ANSWER
    assert streamed(client) == (THINKING, ANSWER, "stop")


def test_template_kwargs_turn_the_thinking_off(client: openai.OpenAI) -> None:
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    message = chat(client, extra_body=off).choices[0].message.model_dump()
    assert message["content"] == ANSWER and message.get("reasoning_content") is None
    assert streamed(client, extra_body=off) == ("", ANSWER, "stop")


def schema_format() -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "ok", "schema": OK, "strict": True}}


@pytest.mark.parametrize("temperature", [0, 1])
def test_a_schema_is_enforced_after_the_thinking_only(
    client: openai.OpenAI, temperature: float
) -> None:
    message = chat(client, response_format=schema_format(), temperature=temperature, seed=7)
    answer = message.choices[0].message.model_dump()
    assert answer["reasoning_content"] == THINKING  # "{is it]" went through the grammar
    jsonschema.validate(json.loads(answer["content"]), OK)
    thinking, content, finish = streamed(
        client, response_format=schema_format(), temperature=temperature, seed=7
    )
    assert (thinking, finish) == (THINKING, "stop")
    jsonschema.validate(json.loads(content), OK)


def test_the_same_schema_from_the_first_token_changes_the_thinking(
    server: BentoServer, client: openai.OpenAI
) -> None:
    """The native API applies a guide to everything it generates: on the same prompt the model's
    thinking is no longer allowed."""
    prompt = httpx.post(
        f"{server.url}/tokenize", json={"messages": MESSAGES}, timeout=TIMEOUT
    ).json()
    text = httpx.post(
        f"{server.url}/detokenize", json={"tokens": prompt["tokens"]}, timeout=TIMEOUT
    ).json()["prompt"]
    guided = {"type": "json_schema", "guide": json.dumps(OK)}
    body = {"prompt": text, "max_tokens": 40, "temperature": 0, "guided_decoding": guided}
    answer = httpx.post(f"{server.url}/generate_text", json=body, timeout=TIMEOUT).json()
    jsonschema.validate(json.loads(answer["text"]), OK)
    assert not answer["text"].startswith(THINKING[:3])


def test_a_forced_call_comes_after_the_thinking(client: openai.OpenAI) -> None:
    tool = {"type": "function", "function": {"name": "confirm", "parameters": OK}}
    named = {"type": "function", "function": {"name": "confirm"}}
    message = chat(client, tools=[tool], tool_choice=named).choices[0]
    assert message.finish_reason == "tool_calls"
    assert message.message.model_dump()["reasoning_content"] == THINKING
    (call,) = message.message.tool_calls
    assert call.function.name == "confirm"
    jsonschema.validate(json.loads(call.function.arguments), OK)


def test_responses_answer_with_a_reasoning_item(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="trtllm-thinking", input=MESSAGES[0]["content"], temperature=0, max_output_tokens=80
    )
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == THINKING
    assert response.output_text == ANSWER
    assert 0 < response.usage.output_tokens_details.reasoning_tokens < response.usage.output_tokens
    events = list(
        client.responses.create(
            model="trtllm-thinking", input=MESSAGES[0]["content"], temperature=0, stream=True
        )
    )
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == THINKING
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"]


def test_encrypted_reasoning_round_trips_and_a_changed_blob_is_a_400(
    client: openai.OpenAI,
) -> None:
    """A stateless client (store false, as Codex): the reasoning item comes sealed, with a
    summary; sent back sealed only, it is the turn's thinking again; changed, it is refused."""
    first = client.responses.create(
        model="trtllm-thinking", input=MESSAGES[0]["content"], temperature=0,
        max_output_tokens=80, store=False, include=["reasoning.encrypted_content"],
        reasoning={"summary": "auto"},
    )  # fmt: skip
    reasoning, message = first.output
    assert reasoning.encrypted_content and THINKING not in reasoning.encrypted_content
    assert reasoning.summary[0].text == THINKING
    sealed_only = {
        "type": "reasoning",
        "summary": [],
        "encrypted_content": reasoning.encrypted_content,
    }
    turn = [
        {"role": "user", "content": MESSAGES[0]["content"]},
        sealed_only,
        {"role": "assistant", "content": message.content[0].text},
        {"role": "user", "content": "And again?"},
    ]
    again = client.responses.create(
        model="trtllm-thinking", input=turn, temperature=0, max_output_tokens=8, store=False
    )
    assert again.status in ("completed", "incomplete")
    blob = reasoning.encrypted_content
    changed = blob[:-6] + ("A" if blob[-6] != "A" else "B") + blob[-5:]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="trtllm-thinking", input=[*turn[:1], {**sealed_only, "encrypted_content": changed},
                                            *turn[2:]],
            max_output_tokens=8, store=False,
        )  # fmt: skip
    assert refused.value.body["param"] == "input[1].encrypted_content"


def test_a_thinking_budget_and_each_effort_cap_the_thinking(
    client: openai.OpenAI, server: BentoServer
) -> None:
    """The thinking takes at most its budget (docs/api.md: low 1/4, medium 1/2 of max_tokens,
    none at high), then its end marker is written for it and the answer follows."""
    tokenizer = thinking_tokenizer()

    def tokens(text: str | None) -> int:
        return len(tokenizer.encode(text or "", add_special_tokens=False))

    capped = chat(client, extra_body={"thinking_budget": 4}).choices[0].message
    assert THINKING.startswith(capped.reasoning_content) and tokens(capped.reasoning_content) == 4
    assert capped.content == ANSWER
    whole, streamed_thinking = capped, ""
    for chunk in client.chat.completions.create(
        model="trtllm-thinking", messages=MESSAGES, stream=True, **GREEDY,
        extra_body={"thinking_budget": 4},
    ):  # fmt: skip
        streamed_thinking += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
    assert streamed_thinking == whole.reasoning_content
    thinking = {
        effort: chat(client, max_tokens=24, reasoning_effort=effort).choices[0].message
        for effort in ("low", "medium", "high")
    }
    assert {effort: tokens(m.reasoning_content) for effort, m in thinking.items()} == {
        "low": 6, "medium": 12, "high": 15,
    }  # fmt: skip
    assert {m.content for m in thinking.values()} == {ANSWER}
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    message = claude.messages.create(
        model="trtllm-thinking", max_tokens=80, messages=MESSAGES,
        thinking={"type": "enabled", "budget_tokens": 5}, extra_body={"temperature": 0},
    )  # fmt: skip
    thought, text = message.content
    assert tokens(thought.thinking) == 5 and text.text == ANSWER


def test_messages_answer_with_a_thinking_block(server: BentoServer) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    greedy = {"extra_body": {"temperature": 0}}
    message = client.messages.create(
        model="trtllm-thinking", max_tokens=80, messages=MESSAGES, **greedy
    )
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == THINKING and message.content[1].text == ANSWER
    off = client.messages.create(
        model="trtllm-thinking", max_tokens=80, messages=MESSAGES,
        thinking={"type": "disabled"}, **greedy,
    )  # fmt: skip
    assert [block.type for block in off.content] == ["text"] and off.content[0].text == ANSWER
    with client.messages.stream(
        model="trtllm-thinking", max_tokens=80, messages=MESSAGES, **greedy
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].thinking == THINKING and final.stop_reason == "end_turn"


def test_the_checkpoint_is_what_the_tests_rely_on(tmp_path: Path) -> None:
    """The wiring holds without the service too: transformers' own greedy decoding."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint = build_thinking_checkpoint(tmp_path / "checkpoint")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    out = model.generate(ids, max_new_tokens=40, do_sample=False)
    written = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert written == f"{THINKING}</think>{ANSWER}"
