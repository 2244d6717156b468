"""The ways through Triton a request can take, one object each (see :mod:`.base`)."""

from .base import ROUTE_MODELS, Decoder, EngineRoute, Route, RouteRequest
from .factory import make_route

__all__ = ["ROUTE_MODELS", "Decoder", "EngineRoute", "Route", "RouteRequest", "make_route"]
