"""The Responses API's built-in tools that the client runs (`shell`, `local_shell`,
`apply_patch`), served by a model that knows only functions.

OpenAI's own models call these tools in a format of their own. Here each is offered to the model
as a function named after its type, as a custom tool is (:mod:`.conversion`): its parameters
mirror the call item's `action` (or `operation`), and its description says how to use it. A call
of that function is reported as the documented item (`shell_call`, `local_shell_call`,
`apply_patch_call`) with the arguments as its action; the client runs it and sends back the call
and its output item, which are the assistant's tool call and the tool message of the chat
history again.

A call whose arguments do not fit the shape (not JSON, a wrong type, a field missing) is reported
as the `function_call` it is, raw arguments and all, as any malformed function call is: its
arguments are never guessed into a command for the client to run.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import validation_message
from ..ids import new_id
from ..request_errors import RequestError
from .protocol import (
    ApplyPatchCallItem,
    ApplyPatchCallOutputItem,
    ApplyPatchTool,
    ClientCallItem,
    ClientOutputItem,
    LocalShellCallItem,
    LocalShellCallOutputItem,
    LocalShellTool,
    ShellCallItem,
    ShellCallOutputItem,
    ShellOutput,
    ShellTool,
)

# Tool types the client runs; each is offered as a function of that name.
CLIENT_TOOLS = ("shell", "local_shell", "apply_patch")
# Those a tool_choice of their own type forces, as OpenAI documents (`{"type": "shell"}`).
FORCEABLE = ("shell", "apply_patch")
# Where a shell runs on OpenAI's side: a container of theirs.
_CONTAINERS = ("container_auto", "container_reference")

_TIMEOUT = {"type": "integer", "minimum": 1, "description": "how long it may run, in ms"}
_PARAMETERS: dict[str, dict[str, Any]] = {
    "shell": {
        "type": "object",
        "properties": {
            "commands": {
                "type": "array", "items": {"type": "string"}, "minItems": 1,
                "description": "the command lines to run, in order, each by the shell",
            },
            "timeout_ms": _TIMEOUT,
            "max_output_length": {
                "type": "integer", "minimum": 1,
                "description": "the most characters of output to return",
            },
        },
        "required": ["commands"],
        "additionalProperties": False,
    },
    "local_shell": {
        "type": "object",
        "properties": {
            "command": {
                "type": "array", "items": {"type": "string"}, "minItems": 1,
                "description": 'the program and its arguments (argv), e.g. ["bash", "-lc", "ls"]',
            },
            "env": {
                "type": "object", "additionalProperties": {"type": "string"},
                "description": "environment variables to set",
            },
            "working_directory": {"type": "string"},
            "timeout_ms": _TIMEOUT,
            "user": {"type": "string", "description": "the user to run it as"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    "apply_patch": {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["create_file", "update_file", "delete_file"]},
            "path": {"type": "string", "description": "the file, relative to the working directory"},
            "diff": {"type": "string", "description": "a V4A diff (create_file, update_file)"},
        },
        "required": ["type", "path"],
        "additionalProperties": False,
    },
}  # fmt: skip
_DESCRIPTIONS = {
    "shell": (
        "Runs shell commands on the user's machine and returns what each printed (stdout, "
        "stderr) and how it ended (its exit code, or a timeout). `commands` run in order."
    ),
    "local_shell": (
        "Runs one command on the user's machine and returns its output. `command` is argv: "
        'the program, then its arguments; a shell command line is ["bash", "-lc", "<line>"].'
    ),
    "apply_patch": (
        "Creates, updates or deletes one file on the user's machine. `diff` is in the V4A "
        "format of Codex's apply_patch, without its `*** Begin Patch` envelope. For "
        "update_file: one or more hunks, each an `@@` line (optionally followed by a line that "
        "locates it, such as `@@ def main():`), then the lines of the change, each prefixed "
        "with a space (kept, about 3 lines of context around a change), `-` (removed) or `+` "
        "(added). For create_file: every line of the new file prefixed with `+`. delete_file "
        "takes no diff."
    ),
}


class _Arguments(BaseModel):
    """What a call's arguments must be to become the call item (extra keys are dropped)."""

    model_config = ConfigDict(strict=True, extra="ignore")


class _ShellArguments(_Arguments):
    commands: list[str] = Field(min_length=1)
    timeout_ms: int | None = Field(None, ge=1)
    max_output_length: int | None = Field(None, ge=1)


class _LocalShellArguments(_Arguments):
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    timeout_ms: int | None = Field(None, ge=1)
    working_directory: str | None = None
    user: str | None = None


class _PatchArguments(_Arguments):
    type: Literal["create_file", "update_file", "delete_file"]
    path: str = Field(min_length=1)
    diff: str | None = None

    @model_validator(mode="after")
    def _diff_where_needed(self) -> _PatchArguments:
        if self.type != "delete_file" and self.diff is None:
            raise ValueError(f"{self.type} needs a diff")
        return self


_TOOL_MODELS: dict[str, type[BaseModel]] = {
    "shell": ShellTool,
    "local_shell": LocalShellTool,
    "apply_patch": ApplyPatchTool,
}


def runs_on_openai(tool: dict[str, Any]) -> bool:
    """A shell tool whose environment is one of OpenAI's containers: not the client's to run."""
    environment = tool.get("environment")
    return (
        tool.get("type") == "shell"
        and isinstance(environment, dict)
        and environment.get("type") in _CONTAINERS
    )


def client_tools(tools: list[dict[str, Any]] | None) -> set[str]:
    """The client-executed built-ins offered (their calls are reported as their items)."""
    return {
        tool["type"]
        for tool in tools or ()
        if tool.get("type") in CLIENT_TOOLS and not runs_on_openai(tool)
    }


def offered_function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """The function a client-executed built-in is offered to the model as."""
    kind = tool["type"]
    try:
        parsed = _TOOL_MODELS[kind].model_validate(tool)
    except ValidationError as error:
        message, _ = validation_message(error)
        raise RequestError(f"{where}.{message}", param=where) from None
    description = _DESCRIPTIONS[kind]
    environment = getattr(parsed, "environment", None)
    if environment is not None and environment.skills:
        skills = "\n".join(
            f"- {skill.name} ({skill.path}): {skill.description}" for skill in environment.skills
        )
        description += f"\n\nSkills on that machine (folders of instructions to read):\n{skills}"
    return {"name": kind, "description": description, "parameters": _PARAMETERS[kind]}


def call_item(kind: str, arguments: str) -> dict[str, Any] | None:
    """The item a call of a client-executed built-in is reported as; None when its arguments
    do not fit the tool's shape. Its arguments are whole, so it is complete."""
    try:
        if kind == "shell":
            shell = _ShellArguments.model_validate(json.loads(arguments))
            return {
                "type": "shell_call", "id": new_id("sh"), "call_id": new_id("call"),
                "action": shell.model_dump(), "status": "completed",
            }  # fmt: skip
        if kind == "local_shell":
            local = _LocalShellArguments.model_validate(json.loads(arguments))
            return {
                "type": "local_shell_call", "id": new_id("lsh"), "call_id": new_id("call"),
                "action": {"type": "exec", **local.model_dump()}, "status": "completed",
            }  # fmt: skip
        patch = _PatchArguments.model_validate(json.loads(arguments))
    except ValueError:  # not JSON, or not the shape (pydantic's errors are ValueErrors)
        return None
    operation = patch.model_dump(exclude_none=True)
    if patch.type == "delete_file":
        operation.pop("diff", None)
    return {
        "type": "apply_patch_call", "id": new_id("apc"), "call_id": new_id("call"),
        "operation": operation, "status": "completed",
    }  # fmt: skip


def history_call(item: ClientCallItem) -> tuple[str, str]:
    """A call item sent back as the call of the function it was offered as: (name,
    arguments)."""
    if isinstance(item, ShellCallItem):
        arguments = item.action.model_dump(exclude_none=True)
    elif isinstance(item, LocalShellCallItem):
        arguments = item.action.model_dump(exclude_none=True, exclude={"type"})
        if not arguments.get("env"):
            arguments.pop("env", None)
    else:
        assert isinstance(item, ApplyPatchCallItem)
        arguments = item.operation.model_dump(exclude_none=True)
    name = item.type.removesuffix("_call")
    return name, json.dumps(arguments, ensure_ascii=False)


def output_text(item: ClientOutputItem) -> str:
    """An output item as the tool message the model reads."""
    if isinstance(item, LocalShellCallOutputItem):
        return item.output
    if isinstance(item, ApplyPatchCallOutputItem):
        if item.status == "failed":
            return f"failed: {item.output}" if item.output else "failed"
        return item.output or "completed"
    assert isinstance(item, ShellCallOutputItem)
    return "\n\n".join(_shell_text(chunk) for chunk in item.output)


def _shell_text(chunk: ShellOutput) -> str:
    """One command's output: stdout, stderr (labelled), then how it ended."""
    lines = [chunk.stdout.rstrip("\n")] if chunk.stdout else []
    if chunk.stderr:
        lines.append("stderr:\n" + chunk.stderr.rstrip("\n"))
    outcome = chunk.outcome
    ended = "timed out" if outcome.type == "timeout" else f"exit code {outcome.exit_code}"
    lines.append(f"({ended})")
    return "\n".join(lines)
