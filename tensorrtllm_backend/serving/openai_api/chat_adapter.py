"""What the APIs served as chat requests share (the Responses API, Anthropic's Messages): the
chat request they amount to, prepared by :meth:`OpenAIServing.prepare_chat`, with every error
naming the field of the API the client called rather than the chat field behind it."""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import ValidationError

from ..generation import PreparedRequest
from .answers import ChatPlan
from .protocol import ChatCompletionRequest
from .serving import OpenAIError, OpenAIServing


def new_id(prefix: str) -> str:
    """An unguessable id in OpenAI's and Anthropic's style (`resp_…`, `msg_…`, `toolu_…`)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def named(param: str | None, fields: dict[str, str]) -> str | None:
    """The field of an API that a chat field named in an error came from."""
    if param is None:
        return None
    head, dot, rest = param.partition(".")
    return fields.get(head, head) + dot + rest


def chat_request(values: dict[str, Any], fields: dict[str, str]) -> ChatCompletionRequest:
    """The chat request of these values (None values left out); a 400 naming the API's field
    (`fields`: chat field -> the API's)."""
    try:
        return ChatCompletionRequest.model_validate(
            {name: value for name, value in values.items() if value is not None}
        )
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        location = ".".join(str(part) for part in first.get("loc", ()))
        raise OpenAIError(
            f"{location}: {first.get('msg')}", param=named(location or None, fields)
        ) from None


class ChatAdapter:
    """One API over the chat path: `api` labels its metrics, `fields` maps the chat fields its
    errors may name to its own."""

    api: str
    fields: dict[str, str]

    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    async def prepare_chat(
        self, chat: ChatCompletionRequest, size: int
    ) -> tuple[PreparedRequest, ChatPlan]:
        """The chat request prepared (`size`: the request body's bytes, which decide whether
        its tools and template are handled off the event loop)."""
        try:
            return await self.serving.prepare_chat(chat, size, api=self.api)
        except OpenAIError as error:
            error.param = named(error.param, self.fields)
            raise
