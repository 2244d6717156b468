"""The ways through Triton a request can take, one object each (see :mod:`.base`)."""

from .base import (
    PROMPT_NEXT_OUTPUTS,
    PROMPT_OUTPUTS,
    PROMPT_SCORER,
    ROUTE_MODELS,
    Decoder,
    EngineRoute,
    Route,
    RouteRequest,
)
from .factory import make_route

__all__ = [
    "PROMPT_NEXT_OUTPUTS",
    "PROMPT_OUTPUTS",
    "PROMPT_SCORER",
    "ROUTE_MODELS",
    "Decoder",
    "EngineRoute",
    "Route",
    "RouteRequest",
    "make_route",
]
