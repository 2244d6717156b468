"""`/tokenize` and `/detokenize`, with vLLM's request and response shapes (vLLM serves them at
the root, not under /v1, and so does this service).

`/tokenize` takes a `prompt`, or chat `messages` rendered by the model's chat template as
/v1/chat/completions renders them (special tokens are then already in the text, so
`add_special_tokens` defaults to false, as in vLLM); it answers the token ids, their count and the
engine's `max_model_len`, with each token's text when `return_token_strs` is true. `/detokenize`
turns token ids back into text. Fields these requests do not know are logged and ignored, as vLLM
ignores them: clients written for vLLM send its other fields (`GET /tokenizer_info` describes the
tokenizer itself, :mod:`.tokenizer_info`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..chat.core import OFF_LOOP, ChatCore
from ..chat.request import ChatMessage, ChatRequest, RequestModel, Tool
from ..request_errors import RequestError
from ..web.endpoints import Endpoints


class TokenizeRequest(RequestModel):
    """A prompt or chat messages (exactly one of them)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either prompt or messages")
        return self


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[int] = Field(..., max_length=1_000_000)


def _check_model(core: ChatCore, name: str | None) -> None:
    if name is not None and name not in core.model_names():
        raise core.unknown_model(name)


def tokenize(core: ChatCore, request: TokenizeRequest) -> dict[str, Any]:
    _check_model(core, request.model)
    if request.messages is not None:
        chat = ChatRequest.model_validate(
            {
                "model": request.model or core.model_name,
                "messages": request.messages,
                "tools": request.tools,
                "add_generation_prompt": request.add_generation_prompt,
                "chat_template_kwargs": request.chat_template_kwargs,
            }
        )
        text = core.render(chat, core.plan_tools(chat))
        special = bool(request.add_special_tokens)
        images = core.load_images(chat)
        if images:  # each image's tokens counted, as the model sees them
            assert core.vision is not None
            return _counted(core, core.vision.prompt_ids(text, images).expanded, request)
    else:
        assert request.prompt is not None
        text = request.prompt
        special = request.add_special_tokens is not False
    ids = list(core.generator.tokenizer.encode(text, add_special_tokens=special))
    return _counted(core, ids, request)


def _counted(core: ChatCore, ids: list[int], request: TokenizeRequest) -> dict[str, Any]:
    tokenizer = core.generator.tokenizer
    return {
        "count": len(ids),
        "max_model_len": core.generator.limits.max_seq_len,
        "tokens": ids,
        "token_strs": tokenizer.convert_ids_to_tokens(ids) if request.return_token_strs else None,
    }


def detokenize(core: ChatCore, request: DetokenizeRequest) -> dict[str, Any]:
    _check_model(core, request.model)
    tokenizer = core.generator.tokenizer
    size = len(tokenizer)
    outside = [token for token in request.tokens if not 0 <= token < size]
    if outside:
        raise RequestError(
            f"token id {outside[0]} is outside the vocabulary [0, {size})", param="tokens"
        )
    return {"prompt": tokenizer.decode(request.tokens)}


def tokenize_routes(endpoints: Endpoints) -> list[Route]:
    """`POST /tokenize` and `POST /detokenize`, relative to the service's root."""

    async def tokenize_endpoint(request: Request) -> Response:
        core = endpoints.core()
        parsed, size = await endpoints.parse(request, core, TokenizeRequest)
        assert isinstance(parsed, TokenizeRequest)
        # Messages off the loop whatever their size: they may hold image URLs to fetch.
        cost = OFF_LOOP if parsed.messages else size
        return JSONResponse(await core.generator.offloader.run(cost, tokenize, core, parsed))

    async def detokenize_endpoint(request: Request) -> Response:
        core = endpoints.core()
        parsed, size = await endpoints.parse(request, core, DetokenizeRequest)
        assert isinstance(parsed, DetokenizeRequest)
        return JSONResponse(await core.generator.offloader.run(size, detokenize, core, parsed))

    return [
        Route("/tokenize", endpoints.handler(tokenize_endpoint), methods=["POST"]),
        Route("/detokenize", endpoints.handler(detokenize_endpoint), methods=["POST"]),
    ]
