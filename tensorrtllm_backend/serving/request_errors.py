"""The one error type for a request the service cannot serve as sent.

Raised anywhere on the service side of a request (engine limits, a route's own limits, guides,
LoRA names, the chat core, each API's fields) and answered as an HTTP 4xx whose message says what
to change, in the style of the API the client called (:mod:`.errors`). Kept apart from the
modules that raise it so that every layer can depend on it without importing the request path.
"""

from __future__ import annotations


class RequestError(ValueError):
    """The request cannot be served as sent; the message says what to change (HTTP 4xx).

    `param` names the request field to change, where one does; `kind` and `code` are OpenAI's
    error type and machine-readable code where they are not the status's own (e.g.
    ``context_length_exceeded``, ``model_not_found``).
    """

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        kind: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind
        self.code = code
