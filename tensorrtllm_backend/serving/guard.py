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
    {"/generate", "/generate_text", "/v1/completions", "/v1/chat/completions"}
)


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
    error: object = (
        {"error": {"message": message, "type": kind, "param": None, "code": None}}
        if path.startswith("/v1/")
        else {"error": message}
    )
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
        self._expected = (
            f"Bearer {self.settings.api_key}".encode() if self.settings.api_key else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if path in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self._expected is not None:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                await _reject(
                    send, path, 401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
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
