"""The service's HTTP APIs, listed once.

Every place that treats APIs differently reads this registry: the guard (API key, the body
limit, the in-flight bound of generation APIs: :mod:`.guard`), the error handling (which error
body an API answers with: :mod:`.errors`), the metrics (the `api` label) and the deployment
(which paths are left out of tracing: :mod:`.deployment`). Adding an API is one entry here plus
its handler; a path that is not listed gets the strictest treatment (API key, body limit) and
native error bodies, and a unit test checks that every route the service serves is listed.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class ErrorStyle(str, enum.Enum):
    """How an API words its errors."""

    NATIVE = "native"  # {"error": "<what to fix>"}
    OPENAI = "openai"  # OpenAI's error object: {"error": {"message", "type", "param", "code"}}
    ANTHROPIC = "anthropic"  # Anthropic's: {"type": "error", "error": {"type", "message"}}


@dataclass(frozen=True, slots=True)
class API:
    """One HTTP path of the service and how every layer treats it."""

    path: str
    errors: ErrorStyle = ErrorStyle.NATIVE
    # The `api` label of the generation metrics: set for the APIs that generate, and only those.
    metrics_label: str | None = None
    # Its answers may stream: OpenTelemetry would open a span per chunk, so it is left out of
    # tracing unless TRTLLM_TRACE_STREAMS=1.
    streams: bool = False
    # Health probes, metrics and the API schema: no API key, no limits.
    open: bool = False

    @property
    def generation(self) -> bool:
        """Counted by the in-flight bound (TRTLLM_MAX_IN_FLIGHT)."""
        return self.metrics_label is not None


NATIVE_LABEL = "native"
COMPLETIONS_LABEL = "openai_completions"
CHAT_LABEL = "openai_chat"
RESPONSES_LABEL = "openai_responses"
MESSAGES_LABEL = "anthropic_messages"

APIS: tuple[API, ...] = (
    API("/generate", metrics_label=NATIVE_LABEL, streams=True),
    API("/generate_text", metrics_label=NATIVE_LABEL),
    API("/v1/completions", ErrorStyle.OPENAI, COMPLETIONS_LABEL, streams=True),
    API("/v1/chat/completions", ErrorStyle.OPENAI, CHAT_LABEL, streams=True),
    API("/v1/models", ErrorStyle.OPENAI),
    API("/v1/models/{model_id:path}", ErrorStyle.OPENAI),
    API("/v1/responses", ErrorStyle.OPENAI, RESPONSES_LABEL, streams=True),
    *(
        API(f"/v1/responses/{{response_id}}{action}", ErrorStyle.OPENAI)
        for action in ("", "/cancel", "/input_items")
    ),
    API("/v1/messages", ErrorStyle.ANTHROPIC, MESSAGES_LABEL, streams=True),
    API("/v1/messages/count_tokens", ErrorStyle.ANTHROPIC),
    # vLLM's, at the root: a root app mounted on BentoML's (api_surface.py). /health is a probe
    # (routers poll it without the API key), like BentoML's below.
    API("/health", open=True),
    API("/tokenize", ErrorStyle.OPENAI),
    API("/detokenize", ErrorStyle.OPENAI),
    API("/tokenizer_info", ErrorStyle.OPENAI),
    # Any other path under /v1: an error object, not BentoML's plain-text 404.
    API("/v1/{path:path}", ErrorStyle.OPENAI),
    # BentoML's own endpoints and the optional relay of Triton's metrics. /schema.json says what
    # /docs.json says, and BentoML's clients read it before their first call: open, that call
    # is the one that gets the 401 naming the header to send.
    *(
        API(path, open=True)
        for path in (
            "/livez",
            "/readyz",
            "/healthz",
            "/metrics",
            "/triton/metrics",
            "/docs.json",
            "/schema.json",
            "/",
        )
    ),  # fmt: skip
)

OPENAI_PREFIX = "/v1"
ANTHROPIC_PREFIX = "/v1/messages"
# What a path that is not listed gets: the key and the body limit, native errors.
UNLISTED = API("")

_BY_PATH = {api.path: api for api in APIS}


def api_for(path: str) -> API:
    """The registry's entry for a request path (:data:`UNLISTED` when there is none; /v1 paths
    that are not listed, those with ids among them, answer OpenAI error objects, those under
    /v1/messages Anthropic's)."""
    api = _BY_PATH.get(path)
    if api is not None:
        return api
    if path.startswith(ANTHROPIC_PREFIX + "/"):
        return API(path, ErrorStyle.ANTHROPIC)
    if path.startswith(OPENAI_PREFIX + "/"):
        return API(path, ErrorStyle.OPENAI)
    return UNLISTED


def streaming_paths() -> list[str]:
    """Patterns (OpenTelemetry's excluded_urls) of the APIs whose answers stream."""
    return [f"{re.escape(api.path)}$" for api in APIS if api.streams]
