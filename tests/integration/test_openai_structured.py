"""Structured output and tool calling through the OpenAI API, driven by the official `openai`
client against a real `bentoml serve` of the demo model on each token-id route (`direct`: the
CPU engine's xgrammar masks in tensorrt_llm; `llmapi`: our LLM-API model, whose guide tensors
become the LLM API's GuidedDecodingParams, on its CPU stand-in): every guided answer is checked
with jsonschema against the schema it was asked to follow, streamed and not; a tool call's
arguments against the tool's parameters; a tool result in the history reaches the prompt."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bentoml
import jsonschema
import openai
import pytest
from conftest import openai_client, pack  # tests/integration/conftest.py
from transformers import AutoTokenizer

if TYPE_CHECKING:
    from conftest import BentoServer

pytestmark = pytest.mark.integration

TIMEOUT = 120.0
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 200  # room for every bounded schema below: a cut answer fails the test


def closed_object(**properties: dict[str, Any]) -> dict[str, Any]:
    """An object schema that needs every property and allows no other (strict mode's shape)."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def enum(*values: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


# Bounded schemas (enums, booleans, small integers, arrays with maxItems): the demo model's random
# weights write any string for ever, so only bounded values end within the token budget.
BOOLEAN = {"type": "boolean"}
PALETTE = closed_object(ok=BOOLEAN, color=enum("red", "green", "blue"))
NESTED = closed_object(
    user=closed_object(admin=BOOLEAN, role=enum("reader", "writer")), active=BOOLEAN
)
TAGS = closed_object(
    tags={"type": "array", "items": enum("a", "b", "c"), "maxItems": 3},
    level={"type": "integer", "minimum": 0, "maximum": 9},
)
SCHEMAS = {"palette": PALETTE, "nested": NESTED, "tags": TAGS}


def function_tool(
    name: str, description: str, parameters: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """A chat-completions tool; `extra`: more fields of its function (`strict`)."""
    function = {"name": name, "description": description, "parameters": parameters, **extra}
    return {"type": "function", "function": function}


WEATHER = function_tool(
    "get_weather",
    "The current weather of a city",
    closed_object(city=enum("Paris", "Oslo", "Lima"), celsius=BOOLEAN),
    strict=True,
)
CLOCK = function_tool(
    "get_time", "The local time of a time zone", closed_object(zone=enum("UTC", "CET"))
)
TOOLS = [WEATHER, CLOCK]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}


@pytest.fixture(scope="module", params=["direct", "llmapi"])
def tools_model(request: pytest.FixtureRequest) -> str:
    """The demo model with room for prompts that carry tool schemas (its small vocabulary spends
    a token on every few characters of JSON), packed for each route."""
    limits = ("--max-input-len", "1024", "--max-seq-len", "1536")
    if request.param == "llmapi":
        return pack("--demo", "--workflow", "llmapi", "--name", "trtllm-llmapi-tools", *limits)
    return pack("--demo", "--name", "trtllm-demo-tools", *limits)


@pytest.fixture(scope="module")
def server(tools_model: str, module_bento_launcher) -> BentoServer:
    return module_bento_launcher(tools_model, wait=True)


def json_schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def assert_valid(text: str | None, schema: dict[str, Any]) -> Any:
    assert text is not None
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


# --- response_format ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_answers_validate(client: openai.OpenAI, model: str, name: str) -> None:
    for seed in range(3):
        result = client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, seed=seed,
            response_format=json_schema_format(name, SCHEMAS[name]),
        )  # fmt: skip
        choice = result.choices[0]
        assert choice.finish_reason == "stop", choice
        assert_valid(choice.message.content, SCHEMAS[name])


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_streamed_json_schema_answers_validate(client: openai.OpenAI, model: str, name) -> None:
    chunks = list(
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, seed=7, stream=True,
            response_format=json_schema_format(name, SCHEMAS[name]),
        )
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert_valid(text, SCHEMAS[name])
    whole = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, seed=7,
        response_format=json_schema_format(name, SCHEMAS[name]),
    )  # fmt: skip
    assert whole.choices[0].message.content == text


def test_completions_take_a_response_format(client: openai.OpenAI, model: str) -> None:
    result = client.completions.create(
        model=model, prompt="The palette:", max_tokens=MAX_TOKENS,
        extra_body={"response_format": json_schema_format("palette", PALETTE)},
    )  # fmt: skip
    assert_valid(result.choices[0].text, PALETTE)


async def test_concurrent_requests_with_different_schemas(server: BentoServer, model) -> None:
    """16 requests at once, each with its own schema (the enum differs), in one engine batch."""
    client = openai_client(server, TIMEOUT, asynchronous=True)
    schemas = []
    for number in range(16):
        schema = json.loads(json.dumps(PALETTE))
        schema["properties"]["color"]["enum"] = [f"c{number}x", f"c{number}y"]
        schemas.append(schema)

    async def ask(number: int, schema: dict[str, Any]) -> str | None:
        result = await client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, seed=number,
            response_format=json_schema_format(f"s{number}", schema),
            stream=number % 2 == 1,
        )  # fmt: skip
        if number % 2 == 0:
            return result.choices[0].message.content
        return "".join([c.choices[0].delta.content or "" async for c in result if c.choices])

    async with client:
        texts = await asyncio.gather(*(ask(n, s) for n, s in enumerate(schemas)))
    for number, (text, schema) in enumerate(zip(texts, schemas, strict=True)):
        assert assert_valid(text, schema)["color"].startswith(f"c{number}")


def test_json_object_answers_parse(client: openai.OpenAI, model: str) -> None:
    for seed in range(3):
        result = client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, seed=seed,
            response_format={"type": "json_object"},
        )  # fmt: skip
        assert isinstance(json.loads(result.choices[0].message.content or ""), dict)


def test_guided_choice_and_regex(client: openai.OpenAI, model: str) -> None:
    choices = ["yes", "no", "it depends"]
    for seed in range(3):
        result = client.completions.create(
            model=model, prompt="Well?", max_tokens=20, seed=seed,
            extra_body={"guided_choice": choices},
        )  # fmt: skip
        assert result.choices[0].text in choices
    result = client.completions.create(
        model=model, prompt="A date:", max_tokens=20, extra_body={"guided_regex": r"20[0-9]{2}-0[1-9]"}
    )  # fmt: skip
    assert re.fullmatch(r"20[0-9]{2}-0[1-9]", result.choices[0].text)


# --- tools ---------------------------------------------------------------------------------------


def assert_valid_call(call: Any, allowed: set[str]) -> dict[str, Any]:
    assert call.type == "function" and re.fullmatch(r"call_[0-9a-f]+", call.id)
    assert call.function.name in allowed
    return assert_valid(call.function.arguments, PARAMETERS[call.function.name])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_tool_choice_required_returns_a_valid_call(client: openai.OpenAI, model: str, seed) -> None:
    result = client.chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=MAX_TOKENS, seed=seed,
    )  # fmt: skip
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert_valid_call(call, {"get_weather", "get_time"})


def test_named_tool_choice_calls_that_tool(client: openai.OpenAI, model: str) -> None:
    for seed in range(3):
        result = client.chat.completions.create(
            model=model, messages=MESSAGES, tools=TOOLS, max_tokens=MAX_TOKENS, seed=seed,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )  # fmt: skip
        (call,) = result.choices[0].message.tool_calls
        assert_valid_call(call, {"get_time"})
        assert result.choices[0].finish_reason == "tool_calls"


def test_every_choice_gets_its_call(client: openai.OpenAI, model: str) -> None:
    result = client.chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required", n=3, seed=5,
        parallel_tool_calls=False, max_tokens=MAX_TOKENS,
    )  # fmt: skip
    assert [choice.index for choice in result.choices] == [0, 1, 2]
    for choice in result.choices:
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert_valid_call(call, {"get_weather", "get_time"})
    assert len({c.message.tool_calls[0].id for c in result.choices}) == 3


def streamed_calls(chunks: list[Any]) -> tuple[str, list[tuple[str, str, str]], str | None]:
    """(content, [(id, name, arguments)], finish reason) put together from streamed deltas."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.id is not None:
                assert delta.index not in calls and delta.function.arguments == ""
                calls[delta.index] = [delta.id, delta.function.name, ""]
            else:
                assert delta.function.name is None
                calls[delta.index][2] += delta.function.arguments
        finish = choice.finish_reason or finish
    return content, [tuple(call) for call in calls.values()], finish


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_streamed_tool_calls(client: openai.OpenAI, model: str, choice: Any) -> None:
    fields = dict(
        model=model, messages=MESSAGES, tools=TOOLS, tool_choice=choice, seed=11,
        parallel_tool_calls=False, max_tokens=MAX_TOKENS,
    )  # fmt: skip
    content, calls, finish = streamed_calls(
        list(client.chat.completions.create(**fields, stream=True))
    )
    assert finish == "tool_calls" and content == ""
    ((call_id, name, arguments),) = calls
    assert call_id.startswith("call_")
    assert_valid(arguments, PARAMETERS[name])
    (whole,) = client.chat.completions.create(**fields).choices[0].message.tool_calls
    assert (whole.function.name, whole.function.arguments) == (name, arguments)


def test_a_tool_result_in_the_history_is_answered(
    client: openai.OpenAI, model: str, tools_model: str
) -> None:
    first = client.chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, max_tokens=MAX_TOKENS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    call = first.choices[0].message.tool_calls[0]
    history = [
        *MESSAGES,
        first.choices[0].message.model_dump(),  # as the client parsed it, nulls and all
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 14}'},
    ]
    second = client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, max_tokens=12, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    answer = second.choices[0]
    assert answer.message.content and answer.finish_reason == "length"
    # The prompt is the tokenizer's own rendering of the history with the call and its result.
    tokenizer = AutoTokenizer.from_pretrained(
        Path(bentoml.models.get(tools_model).path) / "tokenizer"
    )
    rendered_history = [
        *MESSAGES,
        {"role": "assistant", "content": "", "tool_calls": [{"id": call.id, "type": "function",
         "function": {"name": call.function.name,
                      "arguments": json.loads(call.function.arguments)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 14}'},
    ]  # fmt: skip
    prompt = tokenizer.apply_chat_template(
        rendered_history, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert '{"temperature": 14}' in prompt and call.function.arguments.split(":")[0] in prompt
    assert second.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))


def test_auto_tool_choice_answers_in_text_when_no_call_is_made(
    client: openai.OpenAI, model: str
) -> None:
    """The demo model's random text holds no <tool_call>: the answer is content, and the tools
    reached the prompt (the template renders them)."""
    plain = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, seed=1)
    result = client.chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, max_tokens=8, seed=1
    )
    choice = result.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert result.usage.prompt_tokens > plain.usage.prompt_tokens + 50


def test_streamed_auto_answer_equals_the_whole_one(client: openai.OpenAI, model: str) -> None:
    fields = dict(model=model, messages=MESSAGES, tools=TOOLS, max_tokens=16, temperature=0,
                  extra_body={"ignore_eos": True})  # fmt: skip
    whole = client.chat.completions.create(**fields).choices[0]
    content, calls, finish = streamed_calls(
        list(client.chat.completions.create(**fields, stream=True))
    )
    assert (content, calls, finish) == (whole.message.content, [], whole.finish_reason)


def test_default_temperature_samples(client: openai.OpenAI, model: str) -> None:
    """Without temperature the OpenAI API samples (temperature 1), as OpenAI does."""
    texts = {
        client.completions.create(
            model=model, prompt="Once upon a time", max_tokens=12, seed=seed,
            extra_body={"ignore_eos": True},
        ).choices[0].text
        for seed in range(4)
    }  # fmt: skip
    assert len(texts) > 1


def test_unknown_fields_are_logged_once(
    client: openai.OpenAI, model: str, server: BentoServer
) -> None:
    client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=2, extra_body={"frobnicate_level": 3}
    )
    lines = [line for line in server.log().splitlines() if "frobnicate_level" in line]
    assert len(lines) == 1 and "WARNING" in lines[0] and "unknown field" in lines[0]


def test_a_forced_custom_tool_with_a_regex_format_is_called_with_a_matching_input(
    client: openai.OpenAI, model: str
) -> None:
    """Responses' custom tools: forced, a regex format is enforced on the call's input."""
    tool = {
        "type": "custom", "name": "ticket", "description": "Open a ticket.",
        "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Z]{2,4}-[0-9]{1,4}"},
    }  # fmt: skip
    response = client.responses.create(
        model=model, input="Open a ticket for the outage.", tools=[tool],
        tool_choice={"type": "custom", "name": "ticket"}, max_output_tokens=64, temperature=0.8,
    )  # fmt: skip
    (call,) = [item for item in response.output if item.type == "custom_tool_call"]
    assert call.name == "ticket" and re.fullmatch("[A-Z]{2,4}-[0-9]{1,4}", call.input), call.input
