"""Server-sent events, as every streaming API here frames them: a `data:` line per event (OpenAI's
chunks) or an `event:` line naming it first (the Responses API, Anthropic's Messages)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

SSE_DONE = "data: [DONE]\n\n"


def sse(payload: BaseModel | dict[str, Any] | str) -> str:
    """A `data:` event of a model, a JSON object or pre-rendered JSON."""
    if isinstance(payload, BaseModel):
        payload = payload.model_dump_json(exclude_none=True)
    elif isinstance(payload, dict):
        payload = json.dumps(payload)
    return f"data: {payload}\n\n"


def named_event(kind: str, body: dict[str, Any]) -> str:
    """An event that names its type on an `event:` line (`body` carries it too)."""
    return f"event: {kind}\ndata: {json.dumps(body)}\n\n"
