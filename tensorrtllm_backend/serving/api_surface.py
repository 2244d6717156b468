"""The APIs besides the native ones and /v1 chat and completions, registered in one place:
OpenAI's Responses API and Anthropic's Messages API under /v1, each a protocol and a renderer over
the chat core (:mod:`.chat`), and vLLM's /health, /tokenize, /detokenize and /tokenizer_info at
the root. Each path is in the registry too (:mod:`.apis`), which decides how the guard and the
errors treat it."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.routing import BaseRoute

from .anthropic_api.routes import messages_routes
from .responses_api.routes import responses_routes
from .vllm_api.health import NotReadyReason, health_routes
from .vllm_api.tokenize import tokenize_routes
from .vllm_api.tokenizer_info import tokenizer_info_routes
from .web.endpoints import CoreProvider, Endpoints


def v1_routes(endpoints: Endpoints) -> list[BaseRoute]:
    """The routes, relative to /v1, sharing the /v1 app's :class:`Endpoints`."""
    return [*responses_routes(endpoints), *messages_routes(endpoints)]


def root_app(get_core: CoreProvider, not_ready: NotReadyReason) -> Starlette:
    """The routes served at the service's root; `get_core` returns None while the model
    loads, `not_ready` why the replica cannot serve (None when it can)."""
    endpoints = Endpoints(get_core)
    return Starlette(
        routes=[
            *health_routes(not_ready),
            *tokenize_routes(endpoints),
            *tokenizer_info_routes(endpoints),
        ]
    )
