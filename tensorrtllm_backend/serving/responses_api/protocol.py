"""Pydantic models of OpenAI's Responses API as served here (`POST /v1/responses`).

Types are strict at this edge, as on the chat API. What the API defines and this server cannot do
is a 400 naming it (:meth:`ResponsesRequest.unsupported`): hosted tools (web search, file search,
computer use, code interpreter, MCP, image generation...) unless TRTLLM_HOSTED_TOOLS=omit leaves
them out, background runs, conversations, stored prompts. Bookkeeping fields (metadata, user, service_tier, prompt caching hints)
are accepted and change nothing.

Input items are read by their `type` (a message may leave it out): messages, `function_call`,
`function_call_output`, `reasoning` items, custom tool calls and the calls of the client-executed
built-in tools (`shell`, `local_shell`, `apply_patch`) with their outputs are the conversation;
any other item type is a 400. A message's content and a function call's output are text and
`input_image` parts (Codex's `view_image` answers with an image); files are a 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from ..chat.images import image_part
from ..chat.request import NAME_PATTERN, BookkeepingFields, RequestModel
from ..schemas import MAX_GUIDE_CHARS, UINT64_MAX
from .fields import RESPONSES_FIELDS

# Tool types of the Responses API that run on OpenAI's side: the model cannot call them here.
HOSTED_TOOLS = frozenset(
    {
        "web_search", "web_search_preview", "web_search_2025_08_26", "file_search",
        "computer_use_preview", "computer_use", "code_interpreter", "mcp", "image_generation",
        "tool_search",
    }
)  # fmt: skip
# `include` values this server answers: reasoning items with their thinking sealed.
HARMLESS_INCLUDES = frozenset({"reasoning.encrypted_content"})


class TextPart(RequestModel):
    """A text part of a message: `input_text`, or `output_text` of an answer sent back."""

    type: Literal["input_text", "output_text", "text", "refusal"]
    text: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None

    def value(self) -> str:
        return (self.refusal if self.type == "refusal" else self.text) or ""


class ImagePart(RequestModel):
    """An image (`input_image`) of a user message or of a function call's output: a URL, a data:
    URI included; OpenAI's stored files (`file_id`) are not here."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high", "original"] | None = None  # sizes are the model's

    @model_validator(mode="after")
    def _has_url(self) -> ImagePart:
        if not self.image_url:
            raise ValueError(
                "input_image needs image_url (a data: URI, or an http(s) URL of an allowed "
                "host); file_id names OpenAI's stored files, which this server does not have"
            )
        return self


MessagePart = Annotated[TextPart | ImagePart, Field(discriminator="type")]
PART_TYPES = ("input_text", "output_text", "text", "refusal", "input_image")


def _known_parts(parts: Any) -> Any:
    """Parts of the types read here; any other (`input_file`...) is a 400 naming its type."""
    for part in parts if isinstance(parts, list) else ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in PART_TYPES:
            hint = "; send a file's text as input_text" if kind == "input_file" else ""
            raise ValueError(
                f"parts of type {kind!r} are not supported here (this server reads "
                f"{', '.join(PART_TYPES)}{hint})"
            )
    return parts


class PartsItem(RequestModel):
    """An item of text and image parts. It keeps its place in the request (`input[2]`, the
    validation context's "where", as :func:`.conversion.parse_items` gives it): errors name
    each image by it."""

    _where: str = PrivateAttr("")

    @model_validator(mode="after")
    def _placed(self, info: ValidationInfo) -> PartsItem:
        if isinstance(info.context, dict):
            self._where = str(info.context.get("where", ""))
        return self

    @staticmethod
    def _text(parts: str | list[MessagePart]) -> str:
        if isinstance(parts, str):
            return parts
        return "".join(part.value() for part in parts if isinstance(part, TextPart))

    def _chat_parts(self, parts: str | list[MessagePart], field: str) -> str | list[dict[str, Any]]:
        """Parts as a chat message's content: their text, or OpenAI's parts in their order
        where they hold an image (each named by its place, `input[2].content[1]`)."""
        if isinstance(parts, str) or not any(isinstance(part, ImagePart) for part in parts):
            return self._text(parts)
        where = f"{self._where}.{field}" if self._where else ""
        return [
            image_part(str(part.image_url), f"{where}[{p}]" if where else "")
            if isinstance(part, ImagePart)
            else {"type": "text", "text": part.value()}
            for p, part in enumerate(parts)
        ]


class MessageItem(PartsItem):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    # Parts first: a part's own error is what a refusal quotes, not the string branch's.
    content: list[MessagePart] | str
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _parts_read_here(cls, content: Any) -> Any:
        return _known_parts(content)

    def text(self) -> str:
        """The message's text (its images are the chat content's: :meth:`chat_content`)."""
        return self._text(self.content)

    def chat_content(self) -> str | list[dict[str, Any]]:
        """The content as a chat message's: its text, or OpenAI's parts where it holds an
        image."""
        return self._chat_parts(self.content, "content")


class FunctionCallItem(RequestModel):
    type: Literal["function_call"]
    call_id: str = Field(..., min_length=1)
    name: str = Field(..., pattern=NAME_PATTERN)
    arguments: str
    id: str | None = None
    status: str | None = None
    namespace: str | None = Field(None, pattern=NAME_PATTERN)  # a function of a namespace tool


class FunctionCallOutputItem(PartsItem):
    """A function's output: text, or text and image parts (a screenshot, an image file read)."""

    type: Literal["function_call_output"]
    call_id: str = Field(..., min_length=1)
    output: list[MessagePart] | str
    id: str | None = None
    status: str | None = None

    @field_validator("output", mode="before")
    @classmethod
    def _parts_read_here(cls, output: Any) -> Any:
        return _known_parts(output)

    def text(self) -> str:
        return self._text(self.output)

    def chat_content(self) -> str | list[dict[str, Any]]:
        """The output as its tool message's content: its text, or OpenAI's parts where it
        holds an image."""
        return self._chat_parts(self.output, "output")


class ReasoningText(RequestModel):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(RequestModel):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None

    def text(self) -> str:
        parts = self.content if self.content else self.summary
        return "".join(part.text for part in parts)


class CustomToolCallItem(RequestModel):
    """A call of a custom tool: its input is free-form text, not JSON arguments."""

    type: Literal["custom_tool_call"]
    call_id: str = Field(..., min_length=1)
    name: str = Field(..., pattern=NAME_PATTERN)
    input: str
    id: str | None = None
    status: str | None = None


class CustomToolCallOutputItem(FunctionCallOutputItem):
    type: Literal["custom_tool_call_output"]  # type: ignore[assignment]


# --- the client-executed built-in tools: their calls and outputs (:mod:`.client_tools`) -------


class ShellAction(RequestModel):
    commands: list[str]
    timeout_ms: int | None = None
    max_output_length: int | None = None


class ShellCallItem(RequestModel):
    """A call of the `shell` tool: command lines the client runs, in order."""

    type: Literal["shell_call"]
    call_id: str = Field(..., min_length=1)
    action: ShellAction
    id: str | None = None
    status: str | None = None


class ShellOutcome(RequestModel):
    type: Literal["exit", "timeout"]
    exit_code: int | None = None

    @model_validator(mode="after")
    def _exit_has_code(self) -> ShellOutcome:
        if self.type == "exit" and self.exit_code is None:
            raise ValueError('exit_code: an "exit" outcome needs its exit code')
        return self


class ShellOutput(RequestModel):
    """What one command printed, and how it ended."""

    stdout: str
    stderr: str
    outcome: ShellOutcome


class ShellCallOutputItem(RequestModel):
    type: Literal["shell_call_output"]
    call_id: str = Field(..., min_length=1)
    output: list[ShellOutput]
    max_output_length: int | None = None
    id: str | None = None
    status: str | None = None


class LocalShellAction(RequestModel):
    type: Literal["exec"] = "exec"
    command: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    timeout_ms: int | None = None
    working_directory: str | None = None
    user: str | None = None


class LocalShellCallItem(RequestModel):
    """A call of the `local_shell` tool: one command, as argv."""

    type: Literal["local_shell_call"]
    call_id: str = Field(..., min_length=1)
    action: LocalShellAction
    id: str | None = None
    status: str | None = None


class LocalShellCallOutputItem(RequestModel):
    """OpenAI's reference names the call by this item's `id` (its SDK's type has no `call_id`);
    OpenAI's guide sends `call_id`: either one names the call (`call_id` first)."""

    type: Literal["local_shell_call_output"]
    call_id: str = Field(..., min_length=1)
    output: str
    id: str | None = None
    status: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _call_named_by_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and "call_id" not in data and "id" in data:
            return {**data, "call_id": data["id"]}
        return data


class PatchOperation(RequestModel):
    type: Literal["create_file", "update_file", "delete_file"]
    path: str
    diff: str | None = None


class ApplyPatchCallItem(RequestModel):
    """A call of the `apply_patch` tool: one file created, updated or deleted."""

    type: Literal["apply_patch_call"]
    call_id: str = Field(..., min_length=1)
    operation: PatchOperation
    id: str | None = None
    status: str | None = None


class ApplyPatchCallOutputItem(RequestModel):
    type: Literal["apply_patch_call_output"]
    call_id: str = Field(..., min_length=1)
    status: Literal["completed", "failed"]
    output: str | None = None
    id: str | None = None


ClientCallItem = ShellCallItem | LocalShellCallItem | ApplyPatchCallItem
ClientOutputItem = ShellCallOutputItem | LocalShellCallOutputItem | ApplyPatchCallOutputItem


InputItem = (
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | ReasoningItem
    | CustomToolCallItem
    | CustomToolCallOutputItem
    | ClientCallItem
    | ClientOutputItem
)
ITEM_TYPES: dict[str, type[InputItem]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
    "custom_tool_call": CustomToolCallItem,
    "custom_tool_call_output": CustomToolCallOutputItem,
    "shell_call": ShellCallItem,
    "shell_call_output": ShellCallOutputItem,
    "local_shell_call": LocalShellCallItem,
    "local_shell_call_output": LocalShellCallOutputItem,
    "apply_patch_call": ApplyPatchCallItem,
    "apply_patch_call_output": ApplyPatchCallOutputItem,
}


class FunctionTool(RequestModel):
    type: Literal["function"]
    name: str = Field(..., pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomToolFormat(RequestModel):
    """What a custom tool's input looks like: free text, or text a grammar accepts."""

    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = Field(None, max_length=MAX_GUIDE_CHARS)


class CustomTool(RequestModel):
    """A tool whose input is free-form text (Codex's `apply_patch`, for one)."""

    type: Literal["custom"]
    name: str = Field(..., pattern=NAME_PATTERN)
    description: str | None = None
    format: CustomToolFormat | None = None


class LocalSkill(RequestModel):
    """A skill a local shell environment has: a folder of instructions the model may read."""

    name: str
    description: str
    path: str


class ShellEnvironment(RequestModel):
    """Where a `shell` tool runs: the client's machine (`local`), or OpenAI's containers."""

    type: Literal["local", "container_auto", "container_reference"]
    skills: list[LocalSkill] | None = None


class ShellTool(RequestModel):
    type: Literal["shell"]
    environment: ShellEnvironment | None = None


class LocalShellTool(RequestModel):
    type: Literal["local_shell"]


class ApplyPatchTool(RequestModel):
    type: Literal["apply_patch"]


class TextFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, pattern=NAME_PATTERN)
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema" and (self.name is None or self.json_schema is None):
            raise ValueError('type "json_schema" needs a name and a schema')
        return self


class TextConfig(RequestModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(RequestModel):
    """`reasoning`: effort is the chat template's `reasoning_effort` variable; a summary is the
    thinking itself (nothing here summarizes it)."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # its older name

    def wants_summary(self) -> bool:
        return (self.summary or self.generate_summary) is not None


class ResponsesRequest(BookkeepingFields):
    """`POST /v1/responses`."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    store: bool = True
    previous_response_id: str | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_tool_calls: int | None = Field(None, ge=1)
    reasoning: ReasoningConfig | None = None
    client_metadata: dict[str, Any] | None = None  # Codex's: bookkeeping
    background: bool | None = None
    prompt_cache_retention: str | None = None  # accepted with no effect on the answer
    # Extensions with the chat API's names (as vLLM accepts them on /v1/responses).
    seed: int | None = Field(None, ge=0, le=UINT64_MAX)
    top_k: int | None = Field(None, ge=0)
    min_tokens: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=100.0, allow_inf_nan=False)
    ignore_eos: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """The first field set that this server cannot honour, with what to do instead."""
        refused = RESPONSES_FIELDS.first_refused(self)
        if refused is not None:
            return refused
        for include in self.include or []:
            if include not in HARMLESS_INCLUDES:
                return "include", f"include {include!r} is not supported here"
        return None
