"""Optional re-export of Triton's own Prometheus metrics (TRTLLM_EXPORT_TRITON_METRICS=1).

Triton's metrics port stays on loopback; this relays its text at ``/triton/metrics`` on the
BentoML port, so one scrape target covers both (GPU, KV cache, queue and our engine counters).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route


def build_triton_metrics_app(metrics_url: Callable[[], str | None]) -> Starlette:
    """`metrics_url` returns Triton's loopback metrics URL, or None while it is not running."""

    async def relay(request: Request) -> Response:
        url = metrics_url()
        if url is None:
            return PlainTextResponse("tritonserver is not running\n", status_code=503)
        try:
            async with httpx.AsyncClient(timeout=5) as client:
                upstream = await client.get(url)
        except httpx.HTTPError as error:
            return PlainTextResponse(f"tritonserver metrics unavailable: {error}\n", 503)
        return Response(
            upstream.content,
            status_code=upstream.status_code,
            media_type=upstream.headers.get("content-type", "text/plain"),
        )

    return Starlette(routes=[Route("/metrics", relay, methods=["GET"])])
