"""The APIs served under /v1 besides chat and completions, registered in one place: OpenAI's
Responses API and Anthropic's Messages API, each an adapter over the chat path
(:class:`~.openai_api.serving.OpenAIServing`)."""

from __future__ import annotations

from starlette.routing import BaseRoute

from .anthropic_api.routes import messages_routes
from .openai_api.responses_routes import responses_routes
from .openai_api.routes import ServingProvider


def v1_routes(get_serving: ServingProvider) -> list[BaseRoute]:
    """The routes, relative to /v1; `get_serving` returns None while the model loads."""
    return [*responses_routes(get_serving), *messages_routes(get_serving)]
