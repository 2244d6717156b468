"""The APIs besides the native ones and /v1 chat and completions, registered in one place:
OpenAI's Responses API and Anthropic's Messages API under /v1, each an adapter over the chat path
(:class:`~.openai_api.serving.OpenAIServing`), and vLLM's /tokenize and /detokenize at the root."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.routing import BaseRoute

from .anthropic_api.routes import messages_routes
from .openai_api.responses_routes import responses_routes
from .openai_api.routes import ServingProvider
from .openai_api.tokenize import tokenize_routes


def v1_routes(get_serving: ServingProvider) -> list[BaseRoute]:
    """The routes, relative to /v1; `get_serving` returns None while the model loads."""
    return [*responses_routes(get_serving), *messages_routes(get_serving)]


def root_app(get_serving: ServingProvider) -> Starlette:
    """The routes served at the service's root."""
    return Starlette(routes=tokenize_routes(get_serving))
