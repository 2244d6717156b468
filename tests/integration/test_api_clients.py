"""The Responses API and Anthropic's Messages API driven by the real client libraries, unmodified,
against a real `bentoml serve` of the demo model: the official `openai` client (responses.create
plain, streamed, a tool round trip with function_call_output, previous_response_id,
responses.parse), the OpenAI Agents SDK with its default model (the Responses API) and a tool,
LangChain's ChatOpenAI on the Responses API with bound tools, and the official `anthropic`
client (plain, streamed, a tool round trip).

The demo model's weights are random: forced tool calls and schemas with bounded values (enums,
booleans) are what makes its answers checkable; free text is checked for shape only.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from typing import TYPE_CHECKING, Any, Literal

import anthropic
import httpx
import jsonschema
import openai
import pytest
from conftest import openai_client, pack  # tests/integration/conftest.py
from pydantic import BaseModel

if TYPE_CHECKING:
    from conftest import BentoServer

pytestmark = pytest.mark.integration

TIMEOUT = 120.0
MODEL = "trtllm-demo-clients"


def _png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, "PNG")
    return buffer.getvalue()


TINY_PNG = _png()
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "name": "get_weather", "parameters": CITY, "strict": True}
ONE_CALL = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}


class Forecast(BaseModel):
    sunny: bool
    sky: Literal["clear", "cloudy"]


@pytest.fixture(scope="module")
def clients_model() -> str:
    """The demo model with room for prompts that carry tool schemas."""
    return pack("--demo", "--name", MODEL, "--max-input-len", "1024", "--max-seq-len", "1536")


@pytest.fixture(scope="module")
def server(clients_model: str, module_bento_launcher) -> BentoServer:
    return module_bento_launcher(clients_model, wait=True)


@pytest.fixture(scope="module")
def claude(server: BentoServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url, api_key="unused", max_retries=0, timeout=TIMEOUT
    )


# --- openai: responses -------------------------------------------------------------------------


def test_a_plain_response(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL, input="Tell me a story.", instructions="Be brief.", max_output_tokens=12,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text == message.content[0].text
    usage = response.usage
    assert usage.output_tokens == 12 and usage.input_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0


def test_a_streamed_response_follows_openais_event_sequence(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL, input="Tell me a story.", max_output_tokens=10, stream=True,
            extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text == events[-4].text
    assert final.usage.output_tokens == 10
    assert client.responses.retrieve(final.id).output_text == text


def call_of(response: Any) -> Any:
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), CITY)
    return call


def test_a_tool_round_trip_with_previous_response_id(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL, input="Weather in Paris?", max_output_tokens=64, **ONE_CALL
    )
    assert first.status == "completed"
    call = call_of(first)
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],
        max_output_tokens=8,
    )
    assert second.previous_response_id == first.id and second.output_text is not None
    # The conversation the second answered, newest first: the tool's output, the call, the
    # question.
    items = client.responses.input_items.list(second.id).data
    assert [item.type for item in items] == ["function_call_output", "function_call", "message"]
    assert items[1].call_id == call.call_id
    # The prompt grew by the call and its output: the stored conversation was rendered.
    assert second.usage.input_tokens > first.usage.input_tokens


def test_a_tool_round_trip_with_the_whole_conversation(client: openai.OpenAI) -> None:
    """What stateless clients do (store false): the output items go back as input."""
    question = [{"role": "user", "content": "Weather in Oslo?"}]
    first = client.responses.create(
        model=MODEL, input=question, store=False, max_output_tokens=64, **ONE_CALL
    )
    call = call_of(first)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    history = [*question, *(item.model_dump(exclude_none=True) for item in first.output)]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "cold"}
    second = client.responses.create(
        model=MODEL, input=[*history, output], tools=[WEATHER], store=False, max_output_tokens=8
    )
    assert second.status in ("completed", "incomplete")


def test_parse_into_a_pydantic_model(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(
        model=MODEL, input="The forecast?", text_format=Forecast, max_output_tokens=64
    )
    assert isinstance(parsed.output_parsed, Forecast)
    assert Forecast.model_validate_json(parsed.output_text) == parsed.output_parsed


def test_stored_responses_are_found_deleted_and_forgotten(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    assert client.responses.retrieve(response.id).id == response.id
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.retrieve(response.id)
    assert "not found" in caught.value.body["message"]
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=MODEL, input="Hi", previous_response_id=response.id)
    assert caught.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError, match="only a response in progress"):
        client.responses.cancel(client.responses.create(model=MODEL, input="Hi").id)


async def test_a_response_in_progress_can_be_cancelled(server: BentoServer) -> None:
    client = openai_client(server, TIMEOUT, asynchronous=True)
    stream = await client.responses.create(
        model=MODEL, input="Tell me a long story.", max_output_tokens=1000, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    kinds: list[str] = []
    response_id = ""
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta" and kinds.count(event.type) == 1:
            cancelled = await client.responses.cancel(response_id)
            assert cancelled.status == "cancelled"
    final = event.response
    assert kinds[-1] == "response.incomplete" and final.status == "cancelled"
    assert final.usage.output_tokens < 1000
    assert (await client.responses.retrieve(response_id)).status == "cancelled"
    await client.close()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": {"type": "local_shell"}}, "tool_choice"),
        ({"background": True}, "background"),
        ({"input": [{"type": "input_image_call"}]}, "input[0].type"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format"),
        ({"max_output_tokens": 100_000}, "max_output_tokens"),
    ],
)
def test_what_cannot_be_done_is_a_400_naming_it(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "input": "Hi", **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client.post("/responses", body=body, cast_to=httpx.Response)
    assert caught.value.body["param"] == param, caught.value.body


# --- the OpenAI Agents SDK ---------------------------------------------------------------------


def test_an_agent_with_the_default_model_calls_its_tool(server: BentoServer) -> None:
    """The Agents SDK's default model talks to /v1/responses. First turn: the tool is required;
    after the call the SDK resets tool_choice, and the agent's output type shapes the answer."""
    from agents import (
        Agent,
        ModelSettings,
        Runner,
        function_tool,
        set_default_openai_client,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # no trace upload: nothing leaves the machine
    set_default_openai_client(
        openai_client(server, TIMEOUT, asynchronous=True), use_for_tracing=False
    )
    cities: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather of a city."""
        cities.append(city)
        return f"sunny in {city}"

    agent = Agent(
        name="forecaster",
        instructions="Answer with the forecast.",
        model=MODEL,
        tools=[get_weather],
        output_type=Forecast,
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=64
        ),
    )

    async def run() -> tuple[Any, Any]:
        result = await Runner.run(agent, "Weather in Paris?", max_turns=4)
        streamed = Runner.run_streamed(agent, "Weather in Oslo?", max_turns=4)
        async for _ in streamed.stream_events():
            pass
        return result, streamed

    result, streamed = asyncio.run(run())
    assert isinstance(result.final_output, Forecast)
    assert isinstance(streamed.final_output, Forecast)
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
    assert len(cities) == 2


# --- LangChain ---------------------------------------------------------------------------------


def test_langchain_on_the_responses_api_with_bound_tools(server: BentoServer) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather of a city."""
        return f"sunny in {city}"

    llm = ChatOpenAI(
        model=MODEL, base_url=f"{server.url}/v1", api_key="unused", use_responses_api=True,
        max_tokens=64, max_retries=0, timeout=TIMEOUT,
    )  # fmt: skip
    forced = llm.bind_tools([get_weather], tool_choice="any", parallel_tool_calls=False)
    asked = HumanMessage("Weather in Paris?")
    answer = forced.invoke([asked])
    (call,) = answer.tool_calls
    assert call["name"] == "get_weather" and call["args"]["city"] in ("Paris", "Oslo")
    result = ToolMessage(content=get_weather.invoke(call["args"]), tool_call_id=call["id"])
    final = llm.bind_tools([get_weather]).invoke([asked, answer, result])
    assert final.response_metadata["status"] in ("completed", "incomplete")
    assert final.usage_metadata["input_tokens"] > 0
    chunks = list(forced.stream([asked]))
    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed += chunk
    assert [c["name"] for c in streamed.tool_calls] == ["get_weather"]


# --- anthropic ---------------------------------------------------------------------------------

CLAUDE_TOOL = {"name": "get_weather", "description": "The weather", "input_schema": CITY}


def test_a_plain_message(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model=MODEL, max_tokens=10, system="Be brief.",
        messages=[{"role": "user", "content": "Hello"}], extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.stop_reason == "max_tokens"
    assert [block.type for block in message.content] == ["text"]
    assert message.usage.output_tokens == 10 and message.usage.input_tokens > 0


def test_a_streamed_message_uses_anthropics_events(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hello"}],
        extra_body={"ignore_eos": True},
    ) as stream:  # fmt: skip
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    assert final.content[0].type == "text"


def test_a_tool_round_trip(claude: anthropic.Anthropic) -> None:
    asked = {"role": "user", "content": "Weather in Paris?"}
    first = claude.messages.create(
        model=MODEL, max_tokens=64, tools=[CLAUDE_TOOL], messages=[asked],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )  # fmt: skip
    assert first.stop_reason == "tool_use"
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, CITY)
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}
    second = claude.messages.create(
        model=MODEL, max_tokens=8, tools=[CLAUDE_TOOL],
        messages=[asked, {"role": "assistant", "content": first.content},
                  {"role": "user", "content": [result]}],
    )  # fmt: skip
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert second.usage.input_tokens > first.usage.input_tokens
    counted = claude.messages.count_tokens(
        model=MODEL, tools=[CLAUDE_TOOL],
        messages=[asked, {"role": "assistant", "content": first.content},
                  {"role": "user", "content": [result]}],
    )  # fmt: skip
    assert counted.input_tokens == second.usage.input_tokens


def test_a_stop_sequence_is_reported(claude: anthropic.Anthropic) -> None:
    free = claude.messages.create(
        model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Hello"}],
        extra_body={"temperature": 0, "ignore_eos": True},
    )  # fmt: skip
    stop = next(c for c in free.content[0].text[3:] if c.isalpha())
    cut = claude.messages.create(
        model=MODEL, max_tokens=12, stop_sequences=[stop],
        messages=[{"role": "user", "content": "Hello"}],
        extra_body={"temperature": 0, "ignore_eos": True},
    )  # fmt: skip
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert stop not in (cut.content[0].text if cut.content else "")


def test_errors_are_anthropics(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.messages.create(
            model="nope", max_tokens=4, messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "not_found_error"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [image]}]
        )
    assert "needs media_type and data" in caught.value.body["error"]["message"]
    image["source"]["data"] = base64.b64encode(TINY_PNG).decode()
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [image]}]
        )
    assert "does not take images" in caught.value.body["error"]["message"]
    document = {"type": "document", "source": {"type": "text", "data": "x"}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [document]}]
        )
    assert "'document' are not supported" in caught.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="server tools"):
        claude.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )  # fmt: skip


# --- every API: the whole answer is its stream, concatenated -------------------------------------
# Each API renders the chat core's one answer-event stream; a whole answer is the same events
# collected. Same request and seed, streamed and not: same text, tool calls, usage and finish.

CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
SEEDED = {"seed": 11, "temperature": 1.0}


def test_chat_completions_whole_equals_stream(client: openai.OpenAI) -> None:
    for extra in ({}, {"tools": [CHAT_TOOL], "tool_choice": "required"}):
        fields = {
            "model": MODEL, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "max_tokens": 128, **SEEDED, **extra,
        }  # fmt: skip
        whole = client.chat.completions.create(**fields)
        chunks = list(
            client.chat.completions.create(
                **fields, stream=True, stream_options={"include_usage": True}
            )
        )
        content, calls, finish = "", {}, None
        for chunk in chunks:
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for call in choice.delta.tool_calls or ():
                    entry = calls.setdefault(call.index, ["", ""])
                    entry[0] += call.function.name or ""
                    entry[1] += call.function.arguments or ""
                finish = choice.finish_reason or finish
        (choice,) = whole.choices
        assert content == (choice.message.content or "")
        assert list(calls.values()) == [
            [call.function.name, call.function.arguments]
            for call in choice.message.tool_calls or ()
        ]
        assert finish == choice.finish_reason
        assert chunks[-1].usage == whole.usage
        if extra:
            assert calls, "a forced call streams its call"


def test_completions_whole_equals_stream(client: openai.OpenAI) -> None:
    fields = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 16, **SEEDED}
    whole = client.completions.create(**fields)
    chunks = list(
        client.completions.create(**fields, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(choice.text for chunk in chunks for choice in chunk.choices)
    finish = [choice.finish_reason for chunk in chunks for choice in chunk.choices]
    assert text == whole.choices[0].text
    assert [f for f in finish if f] == [whole.choices[0].finish_reason]
    assert chunks[-1].usage == whole.usage


def test_responses_whole_equals_stream(client: openai.OpenAI) -> None:
    for extra in ({}, ONE_CALL):
        fields = {
            "model": MODEL, "input": "Weather in Oslo?", "max_output_tokens": 128,
            "temperature": 1.0, "store": False, "extra_body": {"seed": 11}, **extra,
        }  # fmt: skip
        whole = client.responses.create(**fields)
        events = list(client.responses.create(**fields, stream=True))
        streamed = events[-1].response
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        arguments = "".join(
            e.delta for e in events if e.type == "response.function_call_arguments.delta"
        )
        assert text == whole.output_text == streamed.output_text
        whole_calls = [(i.name, i.arguments) for i in whole.output if i.type == "function_call"]
        assert whole_calls == [
            (i.name, i.arguments) for i in streamed.output if i.type == "function_call"
        ]
        assert arguments == "".join(arguments for _, arguments in whole_calls)
        assert streamed.status == whole.status
        assert streamed.usage == whole.usage


def test_messages_whole_equals_stream(claude: anthropic.Anthropic) -> None:
    for extra in ({}, {"tools": [CLAUDE_TOOL], "tool_choice": {"type": "any"}}):
        fields = {
            "model": MODEL, "max_tokens": 128, "extra_body": {"temperature": 0.0},
            "messages": [{"role": "user", "content": "Weather in Oslo?"}], **extra,
        }  # fmt: skip
        whole = claude.messages.create(**fields)
        with claude.messages.stream(**fields) as stream:
            text = "".join(stream.text_stream)
            streamed = stream.get_final_message()
        assert text == "".join(b.text for b in whole.content if b.type == "text")
        assert [b.model_dump(exclude={"id"}) for b in streamed.content] == [
            b.model_dump(exclude={"id"}) for b in whole.content
        ]
        assert (streamed.stop_reason, streamed.stop_sequence) == (
            whole.stop_reason,
            whole.stop_sequence,
        )
        assert streamed.usage == whole.usage


# --- every field of every table, sent to the service ---------------------------------------------

FIELD_ROUTES = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    "completions": ("/v1/completions", {"prompt": "Once upon a time"}),
    "responses": ("/v1/responses", {"input": "hi", "max_output_tokens": 8}),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}]}),
}


def test_every_field_of_every_table_is_answered_as_its_table_says(server: BentoServer) -> None:
    from tensorrtllm_backend.serving.field_policy import Policy
    from tensorrtllm_backend.serving.field_tables import TABLES

    sent = 0
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        for name, table in TABLES.items():
            path, base = FIELD_ROUTES[name]
            for rule in table.rules:
                if rule.example is None or "." in rule.name or "[" in rule.name:
                    continue
                example = MODEL if rule.example == "MODEL" else rule.example
                body = {"model": MODEL, "max_tokens": 8, **base, rule.name: example}
                if name == "responses":
                    body.pop("max_tokens")
                answer = http.post(path, json=body)
                sent += 1
                where = f"{name}: {rule.name}={example!r}: {answer.status_code} {answer.text[:300]}"
                if rule.policy is Policy.REFUSED:
                    assert answer.status_code == 400, where
                    assert answer.json()["error"]["message"] == rule.note, where
                else:
                    assert answer.status_code == 200, where
    assert sent >= 100


def test_a_forced_call_cut_by_the_token_limit_is_no_message_text(client: openai.OpenAI) -> None:
    for limit in (2, 4, 6):
        response = client.responses.create(
            model=MODEL, input="Weather in Paris?", max_output_tokens=limit, **ONE_CALL
        )
        assert response.status == "incomplete" and response.output_text == ""
        assert [item.type for item in response.output if item.type == "message"] == []
