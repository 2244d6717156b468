"""Tool-call parsers on answers written in each model family's own format: the calls, the content
around them, and the same result whether the text arrives whole or a character at a time."""

from __future__ import annotations

import json

import pytest

from tensorrtllm_backend.serving.chat.tool_parsers import (
    FORMATS,
    JSON_CALLS,
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    Event,
    ToolCallFormat,
    ToolCallParser,
    detect_format,
)

HERMES, LLAMA, MISTRAL = FORMATS["hermes"], FORMATS["llama3_json"], FORMATS["mistral"]


def parse(fmt: ToolCallFormat, text: str, step: int, calls_first: bool = False) -> list[Event]:
    parser = ToolCallParser(fmt, calls_first)
    events: list[Event] = []
    for start in range(0, len(text), step):
        events += parser.feed(text[start : start + step])
    return events + parser.finish()


def gathered(events: list[Event]) -> tuple[str, list[tuple[str, object]]]:
    """(content, [(name, parsed arguments)]), checking that a call starts before its arguments."""
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, CallStart):
            assert event.index == len(calls), "calls are numbered in order"
            calls[event.index] = [event.name, ""]
        elif isinstance(event, ArgumentsDelta):
            assert event.index in calls, "arguments before the call's start"
            calls[event.index][1] += event.text
    return content, [(name, json.loads(arguments)) for name, arguments in calls.values()]


# Answers as each family writes them (token texts joined; special tokens as the detokenizer
# keeps them).
QWEN_TWO_CALLS = (
    "I'll look both up.\n\n"
    '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
    '"San Francisco, CA, USA", "unit": "celsius"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_temperature_date", "arguments": {"location": '
    '"San Francisco, CA, USA", "date": "2024-10-01", "unit": "celsius"}}\n</tool_call>'
)
LLAMA_PYTHON_TAG = (
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}'
)
LLAMA_PLAIN_TWO = (
    '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
    '{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}'
)
MISTRAL_CALLS = (
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, '
    '{"name": "search", "arguments": {"query": "a \\"quoted\\" {brace} [x]"}}]'
)

CASES = [
    (
        HERMES,
        QWEN_TWO_CALLS,
        "I'll look both up.",
        [
            (
                "get_current_temperature",
                {"location": "San Francisco, CA, USA", "unit": "celsius"},
            ),
            (
                "get_temperature_date",
                {"location": "San Francisco, CA, USA", "date": "2024-10-01", "unit": "celsius"},
            ),
        ],
    ),
    (LLAMA, LLAMA_PYTHON_TAG, "", [("get_weather", {"city": "Paris", "days": 3})]),
    (
        LLAMA,
        LLAMA_PLAIN_TWO,
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})],
    ),
    (
        MISTRAL,
        MISTRAL_CALLS,
        "",
        [
            ("get_weather", {"city": "Paris", "unit": "c"}),
            ("search", {"query": 'a "quoted" {brace} [x]'}),
        ],
    ),
]


@pytest.mark.parametrize("step", [1, 2, 7, 10_000])
@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES, ids=["hermes", "llama-tag",
                         "llama-plain", "mistral"])  # fmt: skip
def test_calls_of_each_format(fmt, text, content, calls, step: int) -> None:
    assert gathered(parse(fmt, text, step)) == (content, calls)


@pytest.mark.parametrize("fmt", [HERMES, LLAMA, MISTRAL], ids=lambda f: f.name)
def test_plain_answers_are_content(fmt: ToolCallFormat) -> None:
    text = "The weather in Paris is mild; bring a coat < 10 °C [maybe]."
    for step in (1, 3, 100):
        assert gathered(parse(fmt, text, step)) == (text, [])


def test_arguments_stream_before_the_call_ends() -> None:
    parser = ToolCallParser(HERMES)
    events = parser.feed('<tool_call>{"name": "f", "arguments": {"city": "Par')
    assert events[0] == CallStart(0, "f")
    assert "".join(e.text for e in events[1:] if isinstance(e, ArgumentsDelta)) == '{"city": "Par'


def test_arguments_given_as_a_json_string() -> None:
    text = '<tool_call>{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}</tool_call>'
    assert gathered(parse(HERMES, text, 1)) == ("", [("f", {"a": [1, 2]})])


def test_call_without_arguments_gets_an_empty_object() -> None:
    assert gathered(parse(HERMES, '<tool_call>{"name": "now"}</tool_call>', 1)) == (
        "",
        [("now", {})],
    )


def test_name_after_arguments() -> None:
    text = '<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>'
    assert gathered(parse(HERMES, text, 1)) == ("", [("f", {"x": 1})])


def test_broken_call_text_is_content() -> None:
    text = "Sure. <tool_call> I cannot do that"
    content, calls = gathered(parse(HERMES, text, 1))
    assert calls == [] and content.startswith("Sure.") and "I cannot do that" in content


def test_object_without_a_name_is_content() -> None:
    text = '{"city": "Paris"} is what I found'
    content, calls = gathered(parse(LLAMA, text, 1))
    assert calls == [] and content == text


def test_truncated_call_keeps_the_arguments_so_far() -> None:
    events = parse(HERMES, '<tool_call>{"name": "f", "arguments": {"a": "hel', 1)
    assert events[0] == CallStart(0, "f")
    assert "".join(e.text for e in events if isinstance(e, ArgumentsDelta)) == '{"a": "hel'


def test_guided_json_array_of_calls() -> None:
    text = '[{"name":"f","arguments":{"a":1}},{"name":"g","arguments":{"b":[true,null]}}]'
    for step in (1, 5):
        assert gathered(parse(JSON_CALLS, text, step, calls_first=True)) == (
            "",
            [("f", {"a": 1}), ("g", {"b": [True, None]})],
        )


def test_partial_marker_is_held_back_until_it_is_known() -> None:
    parser = ToolCallParser(HERMES)
    assert parser.feed("Look <tool_") == [ContentDelta("Look")]
    assert parser.feed("box>") == [ContentDelta(" <tool_box>")]


QWEN_TEMPLATE_PART = (
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and '
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n" }}'
)
LLAMA_TEMPLATE_PART = (
    '{%- if builtin_tools is defined or tools is not none %}{{- "Environment: ipython\\n" }}'
    "{%- endif %}{{- '<|python_tag|>' + tool_call.name + '.call(' }}"
)
MISTRAL_TEMPLATE_PART = '{{- "[TOOL_CALLS][" }}{%- for tool_call in message.tool_calls %}'


def test_format_detected_from_the_chat_template() -> None:
    assert detect_format(QWEN_TEMPLATE_PART) is HERMES
    assert detect_format(LLAMA_TEMPLATE_PART) is LLAMA
    assert detect_format(MISTRAL_TEMPLATE_PART) is MISTRAL
    assert detect_format({"default": "plain", "tool_use": QWEN_TEMPLATE_PART}) is HERMES
    assert detect_format("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert detect_format(None) is None
