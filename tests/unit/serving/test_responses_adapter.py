"""The Responses API's translation: input items into chat messages, tools and tool choices into
the chat API's, what cannot be served refused with the field named, and answer events into output
items with OpenAI's stream events in OpenAI's order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tensorrtllm_backend.serving.chat.events import (
    ArgumentsDelta,
    CallStart,
    ContentDelta,
)
from tensorrtllm_backend.serving.chat.reasoning import ReasoningDelta
from tensorrtllm_backend.serving.request_errors import RequestError
from tensorrtllm_backend.serving.responses_api.conversion import (
    NAMESPACE_SEPARATOR,
    chat_messages,
    chat_request,
    chat_tool_choice,
    chat_tools,
    custom_tools,
    namespaced,
    parse_items,
)
from tensorrtllm_backend.serving.responses_api.output import OutputBuilder
from tensorrtllm_backend.serving.responses_api.protocol import ResponsesRequest

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate_json(json.dumps({"model": "m", "input": "hi", **fields}))


def test_a_conversation_becomes_chat_messages() -> None:
    items = parse_items(
        [
            {"role": "developer", "content": "Be terse."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "ok"}]},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Let me look.", "annotations": []}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": [
                {"type": "input_text", "text": "cold"}]},
        ]
    )  # fmt: skip
    messages = chat_messages("Instructions.", items)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    # The instructions and every developer or system message: one system message, first.
    assert messages[0]["content"] == "Instructions.\n\nBe terse."
    assistant = messages[2]
    assert assistant["content"] == "Let me look." and assistant["reasoning_content"] == "ok"
    assert [call["id"] for call in assistant["tool_calls"]] == ["c1", "c2"]
    assert messages[4] == {"role": "tool", "tool_call_id": "c2", "content": "cold"}


def test_a_call_without_a_message_before_it_is_an_assistant_message_of_its_own() -> None:
    items = parse_items(
        [
            {"role": "user", "content": "Hi"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        ]
    )
    assistant = chat_messages(None, items)[1]
    assert assistant["role"] == "assistant" and assistant["content"] is None


def test_a_functions_images_stay_in_its_tool_message_where_they_stand() -> None:
    """Codex's view_image: its output holds the image (and text parts, as other tools send)."""
    png = "data:image/png;base64,iVBORw0KGgo="
    items = parse_items(
        [
            {"role": "user", "content": "Look at a.png"},
            {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [
                {"type": "input_text", "text": "a.png:"},
                {"type": "input_image", "image_url": png, "detail": "original"}]},
            {"type": "custom_tool_call", "call_id": "c2", "name": "shot", "input": ""},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": [
                {"type": "input_image", "image_url": png}]},
        ]
    )  # fmt: skip
    messages = chat_messages("Be brief.", items)
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": [
        {"type": "text", "text": "a.png:"},
        {"type": "image_url", "image_url": {"url": png}, "where": "input[2].output[1]"},
    ]}  # fmt: skip
    assert messages[5]["content"] == [
        {"type": "image_url", "image_url": {"url": png}, "where": "input[4].output[0]"}
    ]
    assert items[2].text() == "a.png:"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("items", "param", "message"),
    [
        ([{"type": "web_search_call", "id": "x"}], "input[0].type", "not supported"),
        ([{"role": "user", "content": [{"type": "input_image", "file_id": "x"}]}], "input[0]",
         "input_image needs image_url"),
        ([{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}],
         "input[0].content", "type 'input_file' are not supported"),
        ([{"type": "function_call_output", "output": "x"}], "input[0].call_id", "call_id"),
        ([{"type": "function_call_output", "call_id": "c", "output": [
            {"type": "input_image", "file_id": "x"}]}], "input[0].output",
         "input_image needs image_url"),
        ([{"type": "function_call_output", "call_id": "c", "output": [
            {"type": "input_text", "text": "x"}, {"type": "input_file", "file_data": "x"}]}],
         "input[0].output", "type 'input_file' are not supported"),
    ],
)  # fmt: skip
def test_items_that_cannot_be_read_are_a_400(items: list[Any], param: str, message: str) -> None:
    with pytest.raises(RequestError, match=message) as caught:
        parse_items(items)
    assert caught.value.param is not None and caught.value.param.startswith(param)


def test_tools_and_tool_choices_become_the_chat_apis() -> None:
    assert chat_tools([TOOL]) == [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    named = chat_tool_choice({"type": "function", "name": "get_weather"})
    assert named == {"type": "function", "function": {"name": "get_weather"}}
    assert chat_tool_choice("required") == "required"
    # OpenAI-side tools are left out (TRTLLM_HOSTED_TOOLS=omit, the default), or refused.
    assert chat_tools([TOOL, {"type": "web_search"}]) == chat_tools([TOOL])
    assert chat_tools([{"type": "web_search"}]) is None
    with pytest.raises(RequestError) as caught:
        chat_tools([TOOL, {"type": "web_search"}], hosted="reject")
    assert caught.value.param == "tools[1].type"
    with pytest.raises(RequestError) as caught:
        chat_tools([{"type": "not_a_tool"}])
    assert caught.value.param == "tools[0].type"
    with pytest.raises(RequestError, match="allowed_tools"):
        chat_tool_choice({"type": "allowed_tools", "mode": "auto", "tools": []})


def test_text_format_is_the_response_format_unless_a_call_is_forced() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    text = {"format": {"type": "json_schema", "name": "answer", "schema": schema}}
    chat = chat_request(request(text=text, max_output_tokens=7), parse_items("hi"))
    assert chat.response_format is not None and chat.response_format.json_schema is not None
    assert chat.response_format.json_schema.json_schema == schema
    assert chat.max_completion_tokens == 7
    forced = chat_request(
        request(text=text, tools=[TOOL], tool_choice="required"), parse_items("hi")
    )
    assert forced.response_format is None and forced.tool_choice == "required"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "p"}}, "prompt"),
        ({"include": ["file_search_call.results"]}, "include"),
    ],
)
def test_what_cannot_be_done_is_named(fields: dict[str, Any], param: str) -> None:
    refused = request(**fields).unsupported()
    assert refused is not None and refused[0] == param


def test_neutral_values_are_not_refused() -> None:
    neutral = request(
        reasoning={"effort": None}, truncation="disabled", include=[], background=False,
        metadata={"k": "v"}, store=False, top_logprobs=0,
    )  # fmt: skip
    assert neutral.unsupported() is None


def test_answer_events_become_items_and_events_in_openais_order() -> None:
    output = OutputBuilder()
    events = [
        ReasoningDelta("think"),
        ContentDelta("Hi"),
        ContentDelta("!"),
        CallStart(0, "f"),
        ArgumentsDelta(0, '{"a":'),
        ArgumentsDelta(0, "1}"),
        CallStart(1, "g"),
    ]
    stream = list(output.feed(events)) + list(output.finish("completed"))
    kinds = [kind for kind, _ in stream]
    assert kinds == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    reasoning, message, first, second = output.items
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "think"}]
    assert message["content"][0]["text"] == "Hi!" and message["status"] == "completed"
    assert first["arguments"] == '{"a":1}' and second["arguments"] == ""
    indexes = [payload["output_index"] for _, payload in stream]
    assert indexes == sorted(indexes) and indexes[-1] == 3
    assert output.reasoning_text() == "think"


def test_reasoning_effort_is_the_templates_and_a_summary_is_the_thinking() -> None:
    chat = chat_request(request(reasoning={"effort": "high", "summary": "auto"}), parse_items("hi"))
    assert chat.chat_template_kwargs == {"reasoning_effort": "high"}
    own = request(reasoning={"effort": "high"}, chat_template_kwargs={"reasoning_effort": "low"})
    assert chat_request(own, parse_items("hi")).chat_template_kwargs == {"reasoning_effort": "low"}
    output = OutputBuilder(summary=True)
    output.build([ReasoningDelta("think"), ContentDelta("answer")])
    reasoning, message = output.items
    assert reasoning["summary"] == [{"type": "summary_text", "text": "think"}]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "think"}]
    assert message["content"][0]["text"] == "answer"


def test_a_namespace_tool_offers_its_functions_and_calls_come_back_with_it() -> None:
    spawn = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}
    tools = [TOOL, {"type": "namespace", "name": "agents", "description": "d", "tools": [spawn]}]
    offered = [tool["function"]["name"] for tool in chat_tools(tools) or ()]
    assert offered == ["get_weather", f"agents{NAMESPACE_SEPARATOR}spawn_agent"]
    output = OutputBuilder(namespaced=namespaced(tools))
    output.build([CallStart(0, f"agents{NAMESPACE_SEPARATOR}spawn_agent"), ArgumentsDelta(0, "{}")])
    (call,) = output.items
    assert (call["namespace"], call["name"], call["arguments"]) == ("agents", "spawn_agent", "{}")
    # Sent back in the input, the call is the offered function again.
    items = parse_items([{"type": "function_call", "call_id": "c1", "namespace": "agents",
                          "name": "spawn_agent", "arguments": "{}"}])  # fmt: skip
    (assistant,) = chat_messages(None, items)
    assert (
        assistant["tool_calls"][0]["function"]["name"] == f"agents{NAMESPACE_SEPARATOR}spawn_agent"
    )


def test_codexs_first_request_is_served() -> None:
    captured = Path(__file__).parents[2] / "data" / "clients" / "codex-0.171.0-responses.json"
    parsed = ResponsesRequest.model_validate(json.loads(captured.read_text()))
    assert parsed.unsupported() is None
    chat = chat_request(parsed, parse_items(parsed.input))
    assert [m.role for m in chat.messages] == ["system", "user", "user"]
    offered = {tool.function.name for tool in chat.tools or ()}
    assert (
        "exec_command" in offered and f"multi_agent_v1{NAMESPACE_SEPARATOR}spawn_agent" in offered
    )


def test_truncation_auto_leaves_out_the_oldest_turns_only(demo_tokenizer) -> None:
    from tensorrtllm_backend.serving.chat.core import ChatCore
    from tensorrtllm_backend.serving.generation import EngineLimits, Generator
    from tensorrtllm_backend.serving.responses_api.truncation import fitting_items
    from tensorrtllm_backend.triton.client import TritonLLMClient

    client = TritonLLMClient.__new__(TritonLLMClient)  # never called
    turns = [{"role": "developer", "content": "Be terse."}]
    for turn in range(12):
        turns += [{"role": "user", "content": f"question {turn} " + "x" * 200},
                  {"role": "assistant", "content": f"answer {turn}"}]  # fmt: skip
    items = parse_items(turns)
    parsed = request(truncation="auto")

    def chat(kept: list[Any]) -> Any:
        return chat_request(parsed, kept)

    full = ChatCore(Generator(client, demo_tokenizer, EngineLimits(100_000, 100_100)), "m")
    assert fitting_items(items, chat, full) == items  # it fits: nothing is left out
    size = full.prompt_tokens(chat(items))
    core = ChatCore(Generator(client, demo_tokenizer, EngineLimits(size // 2, size)), "m")
    kept = fitting_items(items, chat, core)
    assert core.prompt_tokens(chat(kept)) <= size // 2
    assert kept[0] == items[0] and kept[-1] == items[-1]  # the developer message, the last turn
    first_user = kept[1]
    assert first_user.role == "user"
    dropped = items.index(first_user) - 1
    # The fewest turns: one more would have fit too.
    assert core.prompt_tokens(chat([items[0], *items[dropped - 1 :]])) > size // 2


PATCH_GRAMMAR = {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch"'}


def test_a_custom_tool_is_offered_as_a_function_of_one_string_and_reported_as_its_own_call() -> (
    None
):
    """Codex's freeform tools: the model sees a function of one `input` string (a lark grammar
    in its description, a regex as the string's pattern); its call comes back as a
    custom_tool_call with the raw input, and sent back it is that function's call again."""
    tools = [
        {"type": "custom", "name": "apply_patch", "description": "Edit files.", "format": PATCH_GRAMMAR},
        {"type": "custom", "name": "ticket", "format": {"type": "grammar", "syntax": "regex",
                                                       "definition": "[A-Z]+-[0-9]+"}},
    ]  # fmt: skip
    patch, ticket = (tool["function"] for tool in chat_tools(tools) or ())
    assert patch["parameters"]["required"] == ["input"]
    assert "lark grammar" in patch["description"] and "*** Begin Patch" in patch["description"]
    assert ticket["parameters"]["properties"]["input"]["pattern"] == "[A-Z]+-[0-9]+"
    assert chat_tool_choice({"type": "custom", "name": "ticket"}) == {
        "type": "function", "function": {"name": "ticket"}
    }  # fmt: skip
    output = OutputBuilder(custom=custom_tools(tools))
    arguments = json.dumps({"input": "*** Begin Patch\nx"})
    events = [*output.feed([CallStart(0, "apply_patch"), ArgumentsDelta(0, arguments)])]
    events += output.close()
    (call,) = output.items
    assert call["type"] == "custom_tool_call" and call["input"] == "*** Begin Patch\nx"
    kinds = [kind for kind, _ in events]
    assert "response.custom_tool_call_input.done" in kinds
    assert "response.function_call_arguments.delta" not in kinds
    items = parse_items([
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "diff"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
    ])  # fmt: skip
    assistant, result = chat_messages(None, items)
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"input": "diff"}
    assert (result["role"], result["content"]) == ("tool", "done")


def test_a_forced_call_to_a_lark_custom_tool_is_refused_not_left_unenforced() -> None:
    with pytest.raises(RequestError, match="lark grammar is not enforced") as caught:
        chat_tools(
            [{"type": "custom", "name": "apply_patch", "format": PATCH_GRAMMAR}],
            forced="apply_patch",
        )
    assert caught.value.param == "tools[0].format"
