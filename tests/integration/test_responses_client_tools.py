"""The Responses API's client-executed built-in tools through the official `openai` client,
unmodified, against a real `bentoml serve` of the scripted CPU model (`pack_model.py
--scripted`: asked `CALL <tool> <arguments>`, it calls that tool; given a tool result, it answers
`Tool result: <the result>`).

A `shell` round trip, whole and streamed: the model calls `shell` with a command, the test runs it
as a client would and sends back the `shell_call_output` (through `previous_response_id`, and
statelessly with the whole conversation); the command computes a marker that no prompt holds, so
the marker in the final answer proves the output reached the model. An `apply_patch` call whose
operation parses into the SDK's type, whole and through the SDK's stream helper, and its output
sent back. Arguments that do not fit the shape come back as the function call they are.
"""

from __future__ import annotations

import json
import subprocess
from typing import TYPE_CHECKING, Any

import openai
import pytest
from conftest import pack  # tests/integration/conftest.py
from openai.types.responses import (
    ResponseApplyPatchToolCall,
    ResponseFunctionShellToolCall,
    ResponseFunctionToolCall,
)
from openai.types.responses.response_apply_patch_tool_call import OperationCreateFile

if TYPE_CHECKING:
    from conftest import BentoServer

pytestmark = pytest.mark.integration

MODEL = "trtllm-scripted-builtins"
MARKER = "MARK-7431"
COMMAND = "echo MARK-$((7000+431))"  # prints MARKER, which no prompt contains
SHELL = {"type": "shell"}
APPLY_PATCH = {"type": "apply_patch"}
ASK_SHELL = "Print the marker. CALL shell " + json.dumps(
    {"commands": [COMMAND], "timeout_ms": 10000}
)
CREATE = {"type": "create_file", "path": "hello.txt", "diff": "+hello"}
ASK_PATCH = "Write hello.txt. CALL apply_patch " + json.dumps(CREATE)
LIMIT = 256


@pytest.fixture(scope="module")
def scripted_model() -> str:
    return pack("--scripted", "--name", MODEL, "--max-input-len", "4096", "--max-seq-len", "4608")


@pytest.fixture(scope="module")
def server(scripted_model: str, module_bento_launcher) -> BentoServer:
    return module_bento_launcher(scripted_model, wait=True)


def shell_call(output: list[Any]) -> ResponseFunctionShellToolCall:
    (call,) = output
    assert isinstance(call, ResponseFunctionShellToolCall)
    assert call.action.commands == [COMMAND] and call.action.timeout_ms == 10000
    assert call.call_id.startswith("call_") and call.status == "completed"
    return call


def run_shell(call: ResponseFunctionShellToolCall) -> dict[str, Any]:
    """What a client does with a shell call: run each command, send back what it printed."""
    output = []
    for command in call.action.commands:
        done = subprocess.run(
            ["bash", "-c", command], capture_output=True, text=True, check=False,
            timeout=(call.action.timeout_ms or 10_000) / 1000,
        )  # fmt: skip
        output.append({"stdout": done.stdout, "stderr": done.stderr,
                       "outcome": {"type": "exit", "exit_code": done.returncode}})  # fmt: skip
    return {"type": "shell_call_output", "call_id": call.call_id, "output": output}


def test_a_shell_round_trip_with_previous_response_id(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL, input=ASK_SHELL, tools=[SHELL], max_output_tokens=LIMIT
    )
    assert first.status == "completed"
    call = shell_call(first.output)
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[run_shell(call)], tools=[SHELL],
        max_output_tokens=LIMIT,
    )  # fmt: skip
    assert MARKER in second.output_text and "(exit code 0)" in second.output_text
    items = client.responses.input_items.list(second.id).data
    assert [item.type for item in items] == ["shell_call_output", "shell_call", "message"]
    assert items[1].call_id == call.call_id


def test_a_streamed_shell_round_trip_with_the_whole_conversation(client: openai.OpenAI) -> None:
    """A stateless client (store false): the output items go back as input."""
    question = [{"role": "user", "content": ASK_SHELL}]
    events = list(
        client.responses.create(
            model=MODEL, input=question, tools=[SHELL], store=False, stream=True,
            max_output_tokens=LIMIT,
        )
    )  # fmt: skip
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    added, done, completed = events[2].item, events[3].item, events[4].response
    assert isinstance(added, ResponseFunctionShellToolCall) and added.status == "in_progress"
    call = shell_call(completed.output)
    assert done == call and added.action == call.action
    history = [*question, *(item.model_dump(exclude_none=True) for item in completed.output)]
    answer = client.responses.create(
        model=MODEL, input=[*history, run_shell(call)], tools=[SHELL], store=False, stream=True,
        max_output_tokens=LIMIT,
    )  # fmt: skip
    text = "".join(event.delta for event in answer if event.type == "response.output_text.delta")
    assert MARKER in text


def test_an_apply_patch_call_parses_whole_and_streamed(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL, input=ASK_PATCH, tools=[APPLY_PATCH], max_output_tokens=LIMIT
    )
    (call,) = first.output
    assert isinstance(call, ResponseApplyPatchToolCall)
    assert isinstance(call.operation, OperationCreateFile)
    assert call.operation.model_dump() == CREATE
    with client.responses.stream(
        model=MODEL, input=ASK_PATCH, tools=[APPLY_PATCH], max_output_tokens=LIMIT
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds.count("response.output_item.done") == 1
    (streamed,) = final.output
    assert isinstance(streamed, ResponseApplyPatchToolCall)
    assert streamed.operation.model_dump() == CREATE
    result = {"type": "apply_patch_call_output", "call_id": call.call_id, "status": "completed",
              "output": "Created hello.txt"}  # fmt: skip
    answer = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[result], tools=[APPLY_PATCH],
        max_output_tokens=LIMIT,
    )  # fmt: skip
    assert "Created hello.txt" in answer.output_text


def test_shell_arguments_that_do_not_fit_are_the_function_call_they_are(
    client: openai.OpenAI,
) -> None:
    response = client.responses.create(
        model=MODEL, input='CALL shell {"commands": "ls"}', tools=[SHELL], max_output_tokens=LIMIT
    )
    (call,) = response.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert call.name == "shell" and json.loads(call.arguments) == {"commands": "ls"}
