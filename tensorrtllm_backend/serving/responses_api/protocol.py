"""Pydantic models of OpenAI's Responses API as served here (`POST /v1/responses`).

Types are strict at this edge, as on the chat API. What the API defines and this server cannot do
is a 400 naming it (:meth:`ResponsesRequest.unsupported`): hosted tools (web search, file search,
computer use, code interpreter, MCP, image generation...) unless TRTLLM_HOSTED_TOOLS=omit leaves
them out, background runs, conversations, stored prompts. Bookkeeping fields (metadata, user, service_tier, prompt caching hints)
are accepted and change nothing.

Input items are read by their `type` (a message may leave it out): messages, `function_call`,
`function_call_output` and `reasoning` items are the conversation; any other item type is a 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

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
    """An image of a user message (`input_image`): a URL, a data: URI included; OpenAI's
    stored files (`file_id`) are not here."""

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


def _joined(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(part.value() for part in content)


class MessageItem(RequestModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[MessagePart]
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    def text(self) -> str:
        """The message's text (its images are the chat content's: :meth:`chat_content`)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.value() for part in self.content if isinstance(part, TextPart))

    def chat_content(self) -> str | list[dict[str, Any]]:
        """The content as a chat message's: its text, or OpenAI's parts where it holds an
        image."""
        if isinstance(self.content, str) or not any(
            isinstance(part, ImagePart) for part in self.content
        ):
            return self.text()
        return [
            {"type": "image_url", "image_url": {"url": part.image_url}}
            if isinstance(part, ImagePart)
            else {"type": "text", "text": part.value()}
            for part in self.content
        ]


class FunctionCallItem(RequestModel):
    type: Literal["function_call"]
    call_id: str = Field(..., min_length=1)
    name: str = Field(..., pattern=NAME_PATTERN)
    arguments: str
    id: str | None = None
    status: str | None = None
    namespace: str | None = Field(None, pattern=NAME_PATTERN)  # a function of a namespace tool


class FunctionCallOutputItem(RequestModel):
    type: Literal["function_call_output"]
    call_id: str = Field(..., min_length=1)
    output: str | list[TextPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return _joined(self.output)


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


InputItem = (
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | ReasoningItem
    | CustomToolCallItem
    | CustomToolCallOutputItem
)
ITEM_TYPES: dict[str, type[InputItem]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
    "custom_tool_call": CustomToolCallItem,
    "custom_tool_call_output": CustomToolCallOutputItem,
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
