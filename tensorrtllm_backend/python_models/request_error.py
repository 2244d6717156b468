"""The one error type of a request a model in Triton's stubs cannot serve as sent."""

from __future__ import annotations


class RequestError(ValueError):
    """A problem with one request, not the model's: its message goes back as that request's
    error response (the service answers it with a 4xx)."""
