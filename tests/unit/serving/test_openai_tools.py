"""The OpenAI layer's tool plans, guides and streamed deltas: which requests are refused, the
schemas that force a valid call (checked with jsonschema on real call objects), and streamed
deltas that add up to the non-streamed message."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from chat_deltas import Deltas

from tensorrtllm_backend.serving.chat.answer import ChatPlan
from tensorrtllm_backend.serving.chat.core import check_parser_names
from tensorrtllm_backend.serving.chat.events import ContentDelta
from tensorrtllm_backend.serving.chat.output_format import choice_guide, output_constraint
from tensorrtllm_backend.serving.chat.tool_parsers import FORMATS
from tensorrtllm_backend.serving.chat.tools import (
    calls_schema,
    extract_calls,
    plan_tools,
)
from tensorrtllm_backend.serving.openai_api.protocol import ChatCompletionRequest
from tensorrtllm_backend.serving.request_errors import RequestError
from tensorrtllm_backend.settings import load_settings

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo"]},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "now"}}
HERMES = FORMATS["hermes"]


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate_json(json.dumps(body))


def plan(fmt=HERMES, renders=True, **fields: Any):
    return plan_tools(chat(**fields), fmt, renders)


def test_no_tools_no_plan() -> None:
    assert plan().mode == "none"


def test_tools_default_to_auto_with_the_models_format() -> None:
    result = plan(tools=[WEATHER])
    assert result.mode == "auto" and result.fmt is HERMES and result.guide is None


@pytest.mark.parametrize(
    ("fields", "fmt", "param", "says"),
    [
        ({"tool_choice": "required"}, HERMES, "tool_choice", "needs tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         HERMES, "tool_choice", "not among the tools"),
        ({"tools": [WEATHER, WEATHER]}, HERMES, "tools", "unique"),
        ({"tools": [WEATHER]}, None, "tool_choice", "tool_choice \"required\""),
    ],
)  # fmt: skip
def test_refused_tool_requests(fields, fmt, param: str, says: str) -> None:
    with pytest.raises(RequestError) as caught:
        plan(fmt, **fields)
    assert caught.value.param == param and says in str(caught.value)


def test_a_template_without_tools_refuses_them() -> None:
    for choice in ("auto", "required", "none"):
        with pytest.raises(RequestError, match="does not render tools") as caught:
            plan(HERMES, renders=False, tools=[WEATHER], tool_choice=choice)
        assert caught.value.param == "tools"


def test_named_choice_guides_the_arguments() -> None:
    result = plan(tools=[WEATHER, CLOCK], tool_choice={"type": "function", "function": {"name":
                  "get_weather"}})  # fmt: skip
    assert result.mode == "named" and result.guide is not None
    assert json.loads(result.guide.guide) == WEATHER["function"]["parameters"]
    message = extract_calls(result, '{"city": "Oslo", "unit": "c"}')
    assert message.content is None
    (call,) = message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Oslo", "unit": "c"}


def test_required_guide_accepts_valid_calls_only() -> None:
    result = plan(tools=[WEATHER, CLOCK], tool_choice="required")
    assert result.guide is not None and result.guide.type == "json_schema"
    schema = json.loads(result.guide.guide)
    jsonschema.Draft202012Validator.check_schema(schema)
    valid = [
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "f"}},
        {"name": "now", "arguments": {}},
    ]
    jsonschema.validate(valid, schema)
    for invalid in (
        [],
        [{"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}],
        [{"name": "nope", "arguments": {}}],
        [{"name": "get_weather"}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(invalid, schema)
    message = extract_calls(result, json.dumps(valid))
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        (v["name"], v["arguments"]) for v in valid
    ]


def test_one_call_unless_parallel_and_the_formats_key() -> None:
    single = calls_schema([chat(tools=[WEATHER]).tools[0]], "parameters", parallel=False)
    assert single["maxItems"] == 1 and "parameters" in single["items"]["properties"]
    result = plan(FORMATS["llama3_json"], tools=[WEATHER], tool_choice="required")
    assert "parameters" in json.loads(result.guide.guide)["items"]["properties"]


def test_response_format_mapping() -> None:
    assert output_constraint(chat()) is None
    assert output_constraint(chat(response_format={"type": "text"})) is None
    any_object = output_constraint(chat(response_format={"type": "json_object"})).guide
    assert any_object.type == "json_schema"
    jsonschema.validate({"a": [1]}, json.loads(any_object.guide))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(False, json.loads(any_object.guide))
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    found = output_constraint(chat(response_format={"type": "json_schema", "json_schema": {
        "name": "answer", "schema": schema, "strict": True}}))  # fmt: skip
    assert found.guide.type == "json_schema" and json.loads(found.guide.guide) == schema
    assert found.param == "response_format"
    assert json.loads(output_constraint(chat(guided_json=json.dumps(schema))).guide.guide) == schema
    assert output_constraint(chat(guided_regex="[0-9]+")).guide.type == "regex"
    assert output_constraint(chat(guided_grammar='root ::= "a"')).guide.type == "ebnf_grammar"


def test_two_constraints_are_refused() -> None:
    with pytest.raises(RequestError, match="one output constraint"):
        output_constraint(chat(response_format={"type": "json_object"}, guided_regex="a+"))
    with pytest.raises(RequestError, match="not valid JSON"):
        output_constraint(chat(guided_json="{nope"))


def test_choice_guide_is_an_alternation_of_quoted_strings() -> None:
    guide = choice_guide(["yes", 'say "no"'])
    assert guide.type == "ebnf_grammar" and guide.guide == 'root ::= "yes" | "say \\"no\\""'


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_streamed_deltas_add_up_to_the_whole_message(step: int) -> None:
    result = plan(tools=[WEATHER, CLOCK])
    text = (
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
        '"unit": "c"}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    )
    whole = extract_calls(result, text)
    stream = Deltas(ChatPlan(result).reader())
    deltas: list[dict[str, Any]] = []
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    for number, piece in enumerate(pieces):
        deltas += [json.loads(d) for d in stream.deltas(piece, final=number == len(pieces) - 1)]
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        for call in delta.get("tool_calls", []):
            if "id" in call:  # a call's first delta: id, type and name, empty arguments
                assert call["type"] == "function" and call["function"]["arguments"] == ""
                calls[call["index"]] = {"name": call["function"]["name"], "arguments": ""}
            else:
                assert set(call) == {"index", "function"} and "name" not in call["function"]
                calls[call["index"]]["arguments"] += call["function"]["arguments"]
    assert content == whole.content == "Checking."
    assert stream.calls == 2
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole.tool_calls
    ]


def test_strict_types_at_the_edge() -> None:
    with pytest.raises(ValueError, match="stream"):
        chat(stream="yes")
    with pytest.raises(ValueError, match="max_tokens"):
        chat(max_tokens="10")
    with pytest.raises(ValueError, match="response_format"):
        chat(response_format={"type": "xml"})
    with pytest.raises(ValueError, match="tool_call_id"):
        chat(messages=[{"role": "tool", "content": "sunny"}])


def test_unsupported_and_unknown_fields() -> None:
    assert chat(logit_bias={"42": 5}).unsupported()[0] == "logit_bias"
    assert chat(functions=[{"name": "f"}]).unsupported()[0] == "functions"
    assert chat(logit_bias={}, modalities=["text"]).unsupported() is None
    from tensorrtllm_backend.serving.chat.request import unknown_fields

    request = chat(temprature=1, tools=[{**WEATHER, "extra": 1}])
    assert unknown_fields(request) == ["temprature", "tools[0].extra"]


def test_tool_parser_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRTLLM_TOOL_PARSER", raising=False)
    assert load_settings().tool_parser is None
    monkeypatch.setenv("TRTLLM_TOOL_PARSER", "llama3_json")
    assert load_settings().tool_parser == "llama3_json"
    monkeypatch.setenv("TRTLLM_TOOL_PARSER", "qwen-ish")
    settings = load_settings()  # the registry checks the name when the service starts
    with pytest.raises(ValueError, match="hermes"):
        check_parser_names(settings.tool_parser, settings.reasoning_parser)


@pytest.mark.parametrize(
    "text",
    ['[{"name": ', '[{"name": "get_wea', '[{"name": "get_weather", "arguments": {"city": "Pa'],
)
def test_a_forced_call_cut_short_never_leaks_as_content(text: str) -> None:
    """tool_choice "required" cut by the token limit: no message text, whatever was cut."""
    result = plan(tools=[WEATHER], tool_choice="required")
    for step in (1, 3, len(text)):
        reader = ChatPlan(result).reader()
        events = []
        for start in range(0, len(text), step):
            events += reader.feed(text[start : start + step])
        events += reader.feed("", final=True)
        assert not [e for e in events if isinstance(e, ContentDelta)], events
    assert extract_calls(result, text).content in (None, "")
