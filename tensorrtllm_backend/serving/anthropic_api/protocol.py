"""Pydantic models of Anthropic's Messages API as served here (`POST /v1/messages`,
`POST /v1/messages/count_tokens`).

Strict types, as on the OpenAI API. Content blocks are read by their type: text, tool_use,
tool_result (its text and images), thinking and images (for a model that takes them) make the
conversation; documents and server tools (web search, code execution, MCP servers...) are a 400
naming them. `cache_control` marks are accepted and change nothing (prompt caching is the engine's
KV-cache reuse, which needs no marks).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..schemas import MAX_STOP_WORDS, MAX_WORD_CHARS
from .fields import MESSAGES_FIELDS

NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class AnthropicModel(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class TextBlock(AnthropicModel):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ToolUseBlock(AnthropicModel):
    type: Literal["tool_use"]
    id: str = Field(..., min_length=1)
    name: str = Field(..., pattern=NAME_PATTERN)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolReferenceBlock(AnthropicModel):
    """A deferred tool loaded into the conversation (tool search's result)."""

    type: Literal["tool_reference"]
    tool_name: str


class ImageSource(AnthropicModel):
    """An image's bytes (base64, with their media type) or its URL."""

    type: Literal["base64", "url"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"] | None = None
    data: str | None = None
    url: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> ImageSource:
        if self.type == "base64" and (self.media_type is None or not self.data):
            raise ValueError("a base64 image source needs media_type and data")
        if self.type == "url" and not self.url:
            raise ValueError("a url image source needs url")
        return self

    def url_of(self) -> str:
        """The image as a URL: its own, or a data: URI of its bytes."""
        if self.type == "url":
            return str(self.url)
        return f"data:{self.media_type};base64,{self.data}"


class ImageBlock(AnthropicModel):
    type: Literal["image"]
    source: ImageSource
    cache_control: dict[str, Any] | None = None


# What a tool result holds: text, images (a screenshot, an image file read: where they stand among
# its text, for a model that takes images) and tool references.
ResultBlock = Annotated[TextBlock | ImageBlock | ToolReferenceBlock, Field(discriminator="type")]
RESULT_BLOCK_TYPES = ("text", "image", "tool_reference")


class ToolResultBlock(AnthropicModel):
    type: Literal["tool_result"]
    tool_use_id: str = Field(..., min_length=1)
    # Blocks first: a block's own error is what a refusal quotes, not the string branch's.
    content: list[ResultBlock] | str | None = None
    is_error: bool = False
    cache_control: dict[str, Any] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, content: Any) -> Any:
        for block in content if isinstance(content, list) else ():
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in RESULT_BLOCK_TYPES:
                raise ValueError(
                    f"tool_result content blocks of type {kind!r} are not supported here (this "
                    f"server reads {', '.join(RESULT_BLOCK_TYPES)})"
                )
        return content

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            text = self.content or ""
        else:
            text = "".join(block.text for block in self.content if isinstance(block, TextBlock))
        return f"Error: {text}" if self.is_error else text

    def loaded_tools(self) -> list[str]:
        """The deferred tools this result loads."""
        if not isinstance(self.content, list):
            return []
        return [b.tool_name for b in self.content if isinstance(b, ToolReferenceBlock)]


class ThinkingBlock(AnthropicModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(AnthropicModel):
    """Opaque thinking of Anthropic's own models: nothing to show this model."""

    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")


class Message(AnthropicModel):
    # Claude Code puts system messages among the others (its environment, reminders).
    role: Literal["user", "assistant", "system"]
    # Blocks first: a block's own error is what a refusal quotes, not the string branch's.
    content: list[Block] | str

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, content: Any) -> Any:
        for block in content if isinstance(content, list) else ():
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in BLOCK_TYPES:
                raise ValueError(
                    f"content blocks of type {kind!r} are not supported here (this server reads "
                    f"{', '.join(BLOCK_TYPES)})"
                )
        return content


class Tool(AnthropicModel):
    name: str = Field(..., pattern=NAME_PATTERN)
    input_schema: dict[str, Any] | None = None  # required of client tools (checked below)
    description: str | None = None
    # Client tools have no type or "custom"; others are Anthropic's server tools.
    type: str | None = None
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None
    # Left out of the prompt until a tool_reference block loads it (Anthropic's tool search).
    defer_loading: bool = False
    input_examples: list[Any] | None = None


class ToolChoice(AnthropicModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class TokenThreshold(AnthropicModel):
    type: Literal["input_tokens", "tool_uses", "thinking_turns"]
    value: int = Field(..., ge=0)


class ContextEdit(AnthropicModel):
    """One of context_management.edits: clear old tool results, or old thinking."""

    type: Literal["clear_tool_uses_20250919", "clear_thinking_20251015"]
    trigger: TokenThreshold | None = None
    keep: TokenThreshold | Literal["all"] | None = None
    clear_at_least: TokenThreshold | None = None
    exclude_tools: list[str] | None = None
    clear_tool_inputs: bool = False


class ContextManagement(AnthropicModel):
    edits: list[ContextEdit] = Field(default_factory=list)


class Thinking(AnthropicModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)
    display: str | None = None


class OutputFormat(AnthropicModel):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(..., alias="schema")


class OutputConfig(AnthropicModel):
    format: OutputFormat | None = None
    effort: str | None = None


class CountTokensRequest(AnthropicModel):
    """`POST /v1/messages/count_tokens`: what a message request's prompt would be."""

    model: str
    messages: list[Message] = Field(..., min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None

    def system_text(self) -> str | None:
        if self.system is None or isinstance(self.system, str):
            return self.system or None
        return "\n".join(block.text for block in self.system) or None

    def unsupported(self) -> tuple[str, str] | None:
        """The first field set that this server cannot honour, with what to do instead."""
        refused = MESSAGES_FIELDS.first_refused(self)
        if refused is not None:
            return refused
        for position, tool in enumerate(self.tools or []):
            if tool.type not in (None, "custom"):
                return f"tools[{position}].type", (
                    f"server tools such as {tool.type!r} are not supported: this server runs the "
                    "model only (client tools, with an input_schema, are)"
                )
            if tool.input_schema is None:
                return f"tools[{position}].input_schema", "a tool needs its input_schema"
        return None


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: int = Field(..., ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _check_stops(cls, stops: list[str] | None) -> list[str] | None:
        if stops is None:
            return None
        if len(stops) > MAX_STOP_WORDS:
            raise ValueError(f"at most {MAX_STOP_WORDS} stop sequences are supported")
        if any(not stop or len(stop) > MAX_WORD_CHARS for stop in stops):
            raise ValueError(f"stop sequences must have 1 to {MAX_WORD_CHARS} characters")
        return stops
