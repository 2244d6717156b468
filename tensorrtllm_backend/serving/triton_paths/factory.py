"""The route object for a :class:`~.base.Route` name."""

from __future__ import annotations

from typing import Any

from .base import EngineRoute, Route
from .direct import DirectRoute
from .llmapi import LlmapiRoute
from .text import BlsRoute, EnsembleRoute

_ROUTES: dict[Route, type[EngineRoute]] = {
    Route.DIRECT: DirectRoute,
    Route.ENSEMBLE: EnsembleRoute,
    Route.BLS: BlsRoute,
    Route.LLMAPI: LlmapiRoute,
}


def make_route(route: Route, tokenizer: Any) -> EngineRoute:
    """The route object serving `route` with the model's tokenizer."""
    return _ROUTES[route](tokenizer)
