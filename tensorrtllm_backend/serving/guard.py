"""ASGI middleware in front of every API: optional API key, request-size limit and a bound on
generation requests in flight (429 + Retry-After instead of an unbounded queue).

Health probes, metrics and the API schema stay open so orchestrators and clients can use them.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from ..settings import load_settings

OPEN_PATHS = frozenset(
    {"/livez", "/readyz", "/healthz", "/metrics", "/triton/metrics", "/docs", "/docs.json", "/"}
)
GENERATION_PATHS = frozenset(
    {
        "/generate",
        "/generate_text",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
    }
)
ANTHROPIC_PREFIX = "/v1/messages"
_ANTHROPIC_TYPES = {401: "authentication_error", 413: "request_too_large", 429: "rate_limit_error"}


@dataclass(frozen=True)
class GuardSettings:
    api_key: str | None = None
    max_in_flight: int = 1024
    max_body_bytes: int = 4 * 1024 * 1024
    retry_after_s: int = 1

    @classmethod
    def from_env(cls) -> GuardSettings:
        env = load_settings()
        return cls(
            api_key=env.api_key.get_secret_value() if env.api_key else None,
            max_in_flight=env.max_in_flight,
            max_body_bytes=env.max_request_bytes,
        )


async def _reject(
    send: Send, path: str, status: int, message: str, kind: str, headers: dict[str, str]
) -> None:
    error: object
    if path.startswith(ANTHROPIC_PREFIX):  # Anthropic's error shape for its API
        kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error")
        error = {"type": "error", "error": {"type": kind, "message": message}}
    elif path.startswith("/v1/"):
        error = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    else:
        error = {"error": message}
    body = json.dumps(error).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in headers.items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


class GuardMiddleware:
    def __init__(self, app: ASGIApp, settings: GuardSettings | None = None) -> None:
        self.app = app
        self.settings = settings or GuardSettings.from_env()
        self.in_flight = 0
        key = self.settings.api_key
        self._expected = f"Bearer {key}".encode() if key else None
        self._key = key.encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if path in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self._expected is not None and not self._authorized(headers):
            await _reject(
                send, path, 401,
                "missing or wrong API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                "authentication_error", {"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
            return
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.settings.max_body_bytes:
            await _reject(
                send, path, 413, f"request body is larger than {self.settings.max_body_bytes} bytes",
                "invalid_request_error", {},
            )  # fmt: skip
            return
        if path not in GENERATION_PATHS or self.settings.max_in_flight <= 0:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.settings.max_in_flight:
            await _reject(
                send, path, 429,
                f"too many requests in flight (limit {self.settings.max_in_flight}): retry shortly",
                "rate_limit_error", {"Retry-After": str(self.settings.retry_after_s)},
            )  # fmt: skip
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        """The key as OpenAI clients send it (a bearer token) or as Anthropic's do (x-api-key)."""
        assert self._expected is not None and self._key is not None
        bearer = hmac.compare_digest(headers.get(b"authorization", b""), self._expected)
        return bearer or hmac.compare_digest(headers.get(b"x-api-key", b""), self._key)
