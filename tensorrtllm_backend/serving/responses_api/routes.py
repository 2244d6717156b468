"""The `/v1/responses` routes: create, retrieve, list input items, delete, cancel.

Errors are OpenAI error objects, as on the rest of `/v1`; the stored responses live in one
:class:`~.store.ResponseStore` per worker.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...settings import load_settings
from ..web.endpoints import Endpoints, create_endpoint
from .protocol import ResponsesRequest
from .sealing import ReasoningSeal, new_key
from .serving import ResponsesServing
from .store import ResponseStore


def responses_routes(endpoints: Endpoints, store: ResponseStore | None = None) -> list[Route]:
    """The routes, relative to `/v1`; `store` defaults to one sized by the settings."""
    responses_store = store if store is not None else ResponseStore.from_settings()
    settings = load_settings()
    key = settings.reasoning_key.get_secret_value() if settings.reasoning_key else new_key()
    seal = ReasoningSeal(key)
    handler = endpoints.handler

    def current() -> ResponsesServing:
        return ResponsesServing(endpoints.core(), responses_store, settings.hosted_tools, seal)

    create = create_endpoint(endpoints, ResponsesRequest, current)

    def response_id(request: Request) -> str:
        return str(request.path_params["response_id"])

    async def retrieve(request: Request) -> Response:
        return JSONResponse(current().retrieve(response_id(request)))

    async def input_items(request: Request) -> Response:
        return JSONResponse(current().input_items(response_id(request)))

    async def delete(request: Request) -> Response:
        return JSONResponse(current().delete(response_id(request)))

    async def cancel(request: Request) -> Response:
        return JSONResponse(current().cancel(response_id(request)))

    one = "/responses/{response_id}"
    return [
        Route("/responses", handler(create), methods=["POST"]),
        Route(one, handler(retrieve), methods=["GET"]),
        Route(one, handler(delete), methods=["DELETE"]),
        Route(f"{one}/cancel", handler(cancel), methods=["POST"]),
        Route(f"{one}/input_items", handler(input_items), methods=["GET"]),
    ]
