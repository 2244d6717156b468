"""Identifiers the service makes: unguessable, since they name requests in logs, in Triton's
cancellation and in the ids clients send back (stored responses, tool calls)."""

from __future__ import annotations

import secrets


def new_request_id() -> str:
    """A request's id (the engine's, and the base of each API's answer id)."""
    return secrets.token_hex(12)


def new_id(prefix: str) -> str:
    """An id in OpenAI's and Anthropic's style (`resp_…`, `msg_…`, `toolu_…`, `call_…`)."""
    return f"{prefix}_{secrets.token_hex(12)}"
