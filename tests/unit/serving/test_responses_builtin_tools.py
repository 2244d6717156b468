"""The Responses API's client-executed built-in tools (`shell`, `local_shell`, `apply_patch`):
offered to the model as functions, its calls reported as the documented items (the official
`openai` SDK's types parse them), and the items sent back are the call and the tool result of the
chat history again."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from openai.types.responses import (
    Response,
    ResponseApplyPatchToolCall,
    ResponseFunctionShellToolCall,
    ResponseFunctionToolCall,
    ResponseStreamEvent,
    Tool,
)
from openai.types.responses.response_output_item import LocalShellCall
from pydantic import TypeAdapter
from xgrammar import Grammar
from xgrammar.testing import _is_grammar_accept_string

from tensorrtllm_backend.serving.chat.events import ArgumentsDelta, CallStart, ContentDelta
from tensorrtllm_backend.serving.chat.request import NamedToolChoice
from tensorrtllm_backend.serving.chat.tools import plan_tools
from tensorrtllm_backend.serving.request_errors import RequestError
from tensorrtllm_backend.serving.responses_api.client_tools import client_tools
from tensorrtllm_backend.serving.responses_api.conversion import (
    chat_messages,
    chat_request,
    chat_tool_choice,
    chat_tools,
    parse_items,
    stored_item,
)
from tensorrtllm_backend.serving.responses_api.output import OutputBuilder
from tensorrtllm_backend.serving.responses_api.protocol import ResponsesRequest
from tensorrtllm_backend.serving.responses_api.serving import ResponseRun, ResponsesServing
from tensorrtllm_backend.serving.responses_api.store import ResponseStore

SHELL = {"type": "shell"}
LOCAL_SHELL = {"type": "local_shell"}
APPLY_PATCH = {"type": "apply_patch"}
TOOLS = [SHELL, LOCAL_SHELL, APPLY_PATCH]
SHELL_ARGUMENTS = {"commands": ["ls -la", "cat README.md"], "timeout_ms": 5000}
LOCAL_ARGUMENTS = {
    "command": ["bash", "-lc", "ls"],
    "env": {"LANG": "C"},
    "working_directory": "/w",
}
PATCH_ARGUMENTS = {
    "type": "update_file",
    "path": "app.py",
    "diff": "@@ def main():\n-    a\n+    b",
}
STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
TOOL: TypeAdapter[Any] = TypeAdapter(Tool)


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate_json(json.dumps({"model": "m", "input": "hi", **fields}))


def answered(tools: list[dict[str, Any]], calls: list[tuple[str, str]]) -> tuple[Any, list]:
    """The output a model's calls (name, arguments) make: the builder, and the stream events
    (with sequence numbers, as the stream sends them)."""
    output = OutputBuilder(client=client_tools(tools))
    events: list[Any] = [*output.feed([ContentDelta("On it.")])]
    for index, (name, arguments) in enumerate(calls):
        events += output.feed([CallStart(index, name), ArgumentsDelta(index, arguments)])
    events += output.finish("completed")
    return output, [{"type": kind, "sequence_number": n, **payload}
                    for n, (kind, payload) in enumerate(events)]  # fmt: skip


def as_response(tools: list[dict[str, Any]], items: list[dict[str, Any]]) -> Response:
    """The Response object the service answers with these items, parsed by the SDK."""
    serving = ResponsesServing(SimpleNamespace(model_name="m"), ResponseStore(0, 0))  # type: ignore[arg-type]
    run = ResponseRun(request(tools=tools), None, None, [])  # type: ignore[arg-type]
    return Response.model_validate(serving.response(run, "completed", items))


def test_each_builtin_is_offered_as_a_function_of_its_documented_shape() -> None:
    assert [type(TOOL.validate_python(tool)).__name__ for tool in TOOLS] == [
        "FunctionShellTool", "LocalShell", "ApplyPatchTool"
    ]  # fmt: skip
    shell, local, patch = (tool["function"] for tool in chat_tools(TOOLS) or ())
    assert [shell["name"], local["name"], patch["name"]] == ["shell", "local_shell", "apply_patch"]
    assert shell["parameters"]["required"] == ["commands"]
    assert set(shell["parameters"]["properties"]) == {"commands", "timeout_ms", "max_output_length"}
    assert local["parameters"]["required"] == ["command"]
    assert set(local["parameters"]["properties"]) == {
        "command", "env", "working_directory", "timeout_ms", "user"
    }  # fmt: skip
    assert patch["parameters"]["required"] == ["type", "path"]
    assert patch["parameters"]["properties"]["type"]["enum"] == [
        "create_file", "update_file", "delete_file"
    ]  # fmt: skip
    assert "V4A" in patch["description"] and "argv" in local["description"]
    # A local environment's skills are told to the model.
    skill = {"name": "pdf", "description": "Reads PDFs.", "path": "/skills/pdf"}
    (offered,) = chat_tools(
        [{"type": "shell", "environment": {"type": "local", "skills": [skill]}}]
    )
    assert "pdf (/skills/pdf): Reads PDFs." in offered["function"]["description"]


def test_a_shell_in_openais_container_runs_on_openais_side() -> None:
    hosted = {"type": "shell", "environment": {"type": "container_auto"}}
    assert chat_tools([hosted, APPLY_PATCH]) == chat_tools([APPLY_PATCH])
    assert client_tools([hosted, APPLY_PATCH]) == {"apply_patch"}
    with pytest.raises(RequestError) as caught:
        chat_tools([hosted], hosted="reject")
    assert caught.value.param == "tools[0].environment"


@pytest.mark.parametrize(
    ("choice", "name", "accepted", "refused"),
    [
        ({"type": "shell"}, "shell", '{"commands": ["ls"], "timeout_ms": 10}',
         '{"commands": "ls"}'),
        ({"type": "apply_patch"}, "apply_patch", '{"type": "delete_file", "path": "a.txt"}',
         '{"type": "rename_file", "path": "a.txt"}'),
    ],
)  # fmt: skip
def test_a_forced_builtin_is_a_call_its_guide_keeps_to_the_shape(
    choice: dict[str, str], name: str, accepted: str, refused: str
) -> None:
    chat = chat_request(request(tools=TOOLS, tool_choice=choice), parse_items("hi"))
    assert chat.tool_choice == NamedToolChoice.model_validate(
        {"type": "function", "function": {"name": name}}
    )
    plan = plan_tools(chat, None, template_renders_tools=True)
    assert plan.guide is not None
    grammar = Grammar.from_json_schema(plan.guide.guide)
    assert _is_grammar_accept_string(grammar, accepted)
    assert not _is_grammar_accept_string(grammar, refused)


def test_a_tool_choice_openai_does_not_document_is_a_400() -> None:
    with pytest.raises(RequestError) as caught:
        chat_tool_choice({"type": "local_shell"})
    assert caught.value.param == "tool_choice"


def test_calls_are_the_documented_items_the_sdk_parses() -> None:
    output, events = answered(
        TOOLS,
        [("shell", json.dumps(SHELL_ARGUMENTS)), ("local_shell", json.dumps(LOCAL_ARGUMENTS)),
         ("apply_patch", json.dumps(PATCH_ARGUMENTS))],
    )  # fmt: skip
    response = as_response(TOOLS, output.items)
    message, shell, local, patch = response.output
    assert message.type == "message"
    assert isinstance(shell, ResponseFunctionShellToolCall)
    assert shell.action.commands == ["ls -la", "cat README.md"] and shell.action.timeout_ms == 5000
    assert shell.status == "completed" and shell.call_id.startswith("call_")
    assert isinstance(local, LocalShellCall)
    assert local.action.type == "exec" and local.action.command == ["bash", "-lc", "ls"]
    assert local.action.env == {"LANG": "C"} and local.action.working_directory == "/w"
    assert isinstance(patch, ResponseApplyPatchToolCall)
    assert patch.operation.type == "update_file" and patch.operation.path == "app.py"
    assert patch.operation.diff == PATCH_ARGUMENTS["diff"]  # type: ignore[union-attr]
    # Streamed: every event is one of OpenAI's; a call's item is added and done, whole, with no
    # argument events between.
    parsed = [STREAM_EVENT.validate_python(event) for event in events]
    calls = [event for event in parsed if event.output_index > 0]
    assert [event.type for event in calls] == [
        "response.output_item.added", "response.output_item.done"
    ] * 3  # fmt: skip
    added, done = calls[0].item, calls[1].item
    assert added.status == "in_progress" and done.status == "completed"
    assert added.action == done.action and added.id == done.id
    assert [event.item for event in calls[1::2]] == response.output[1:]


def test_a_delete_has_no_diff_and_a_create_has_its_lines() -> None:
    output, _ = answered(
        [APPLY_PATCH],
        [("apply_patch", '{"type": "delete_file", "path": "old.txt", "diff": ""}'),
         ("apply_patch", '{"type": "create_file", "path": "new.txt", "diff": "+hello"}')],
    )  # fmt: skip
    _, delete, create = as_response([APPLY_PATCH], output.items).output
    assert delete.operation.model_dump() == {"type": "delete_file", "path": "old.txt"}
    assert (create.operation.type, create.operation.diff) == ("create_file", "+hello")


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("shell", '{"commands": ["ls"'),  # cut: not JSON
        ("shell", '{"commands": "ls"}'),  # a string, not a list
        ("shell", '{"commands": []}'),
        ("shell", '{"commands": ["ls"], "timeout_ms": "5"}'),
        ("shell", '["ls"]'),
        ("local_shell", '{"command": ["ls"], "env": {"A": 1}}'),
        ("local_shell", '{"cmd": ["ls"]}'),
        ("apply_patch", '{"type": "update_file", "path": "a.py"}'),  # no diff
        ("apply_patch", '{"type": "rename_file", "path": "a.py", "diff": "x"}'),
    ],
)
def test_arguments_that_do_not_fit_are_the_function_call_they_are(
    name: str, arguments: str
) -> None:
    """As a malformed function call is: reported with its raw arguments, never guessed into a
    command for the client to run."""
    output, events = answered(TOOLS, [(name, arguments)])
    _, call = as_response(TOOLS, output.items).output
    assert isinstance(call, ResponseFunctionToolCall)
    assert (call.name, call.arguments) == (name, arguments)
    kinds = [STREAM_EVENT.validate_python(event).type for event in events][-4:]
    assert kinds == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
    ]  # fmt: skip


def test_a_function_named_like_a_builtin_is_a_function_when_the_builtin_is_not_offered() -> None:
    function = {"type": "function", "name": "shell", "parameters": {"type": "object"}}
    output, _ = answered([function], [("shell", json.dumps(SHELL_ARGUMENTS))])
    assert output.items[-1]["type"] == "function_call"


def sent_back(items: list[Any]) -> list[dict[str, Any]]:
    """Output items as a stateless client sends them back (the SDK's objects, dumped)."""
    return [item.model_dump(exclude_none=True) for item in items]


def test_calls_and_outputs_sent_back_are_the_call_and_the_tool_result() -> None:
    output, _ = answered(
        TOOLS,
        [("shell", json.dumps(SHELL_ARGUMENTS)), ("local_shell", json.dumps(LOCAL_ARGUMENTS)),
         ("apply_patch", json.dumps(PATCH_ARGUMENTS))],
    )  # fmt: skip
    _, shell, local, patch = as_response(TOOLS, output.items).output
    results = [
        {"type": "shell_call_output", "call_id": shell.call_id, "max_output_length": 1000,
         "output": [
             {"stdout": "a\nb\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
             {"stdout": "", "stderr": "no such file\n", "outcome": {"type": "exit", "exit_code": 1}},
         ]},
        # OpenAI's reference names the call by `id`; its guide sends `call_id`.
        {"type": "local_shell_call_output", "id": local.call_id, "output": '{"stdout": "x"}'},
        {"type": "apply_patch_call_output", "call_id": patch.call_id, "status": "failed",
         "output": "context not found"},
    ]  # fmt: skip
    items = parse_items(
        [{"role": "user", "content": "Go."}, *sent_back([shell, local, patch]), *results]
    )
    user, assistant, *tool_messages = chat_messages(None, items)
    assert user["role"] == "user"
    calls = [call["function"] for call in assistant["tool_calls"]]
    assert [call["name"] for call in calls] == ["shell", "local_shell", "apply_patch"]
    # The arguments the model wrote, again.
    assert [json.loads(call["arguments"]) for call in calls] == [
        SHELL_ARGUMENTS, LOCAL_ARGUMENTS, PATCH_ARGUMENTS
    ]  # fmt: skip
    assert [call["id"] for call in assistant["tool_calls"]] == [
        shell.call_id, local.call_id, patch.call_id
    ]  # fmt: skip
    assert [m["tool_call_id"] for m in tool_messages] == [
        shell.call_id, local.call_id, patch.call_id
    ]  # fmt: skip
    assert tool_messages[0]["content"] == (
        "a\nb\n(exit code 0)\n\nstderr:\nno such file\n(exit code 1)"
    )
    assert tool_messages[1]["content"] == '{"stdout": "x"}'
    assert tool_messages[2]["content"] == "failed: context not found"


def test_stored_items_read_back_the_same() -> None:
    """previous_response_id: the items as stored (with ids) are the same conversation."""
    raw = [
        {"type": "shell_call", "call_id": "c1", "action": {"commands": ["ls"]}},
        {"type": "shell_call_output", "call_id": "c1",
         "output": [{"stdout": "", "stderr": "", "outcome": {"type": "timeout"}}]},
        {"type": "local_shell_call", "call_id": "c2",
         "action": {"type": "exec", "command": ["ls"], "env": {}}},
        {"type": "local_shell_call_output", "call_id": "c2", "output": "done"},
        {"type": "apply_patch_call", "call_id": "c3",
         "operation": {"type": "create_file", "path": "a", "diff": "+a"}},
        {"type": "apply_patch_call_output", "call_id": "c3", "status": "completed"},
    ]  # fmt: skip
    items = parse_items(raw)
    stored = [stored_item(item) for item in items]
    assert all(item["id"] for item in stored)
    again = parse_items(stored, "previous_response_id")
    assert chat_messages(None, again) == chat_messages(None, items)
    messages = chat_messages(None, items)
    assert [m["content"] for m in messages if m["role"] == "tool"] == [
        "(timed out)", "done", "completed"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "shell_call_output", "call_id": "c",
          "output": [{"stdout": "", "stderr": "", "outcome": {"type": "exit"}}]}, "input[0].output"),
        ({"type": "shell_call", "call_id": "c", "action": {"commands": "ls"}}, "input[0].action"),
        ({"type": "local_shell_call_output", "output": "x"}, "input[0].call_id"),
        ({"type": "apply_patch_call_output", "call_id": "c", "status": "done"}, "input[0].status"),
        ({"type": "apply_patch_call", "call_id": "c",
          "operation": {"type": "move_file", "path": "a"}}, "input[0].operation"),
    ],
)  # fmt: skip
def test_items_that_do_not_fit_are_a_400_naming_them(item: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_items([item])
    assert caught.value.param is not None and caught.value.param.startswith(param)
