"""`GET /health`, as vLLM serves it: the probe that routers in front of vLLM replicas poll.
vllm-router waits at start until every worker answers 200 here (whatever its
`--health-check-endpoint` says), then asks every `--health-check-interval-secs` and takes a worker
out of rotation after `--health-failure-threshold` failures in a row.

200 with an empty body while this replica serves, as vLLM answers; 503 otherwise, with the reason
/readyz gives (vLLM's 503 has no body; the reason tells an operator why the router left this
replica out). The answer comes from state, as /readyz's does: no I/O on the probe's path.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

# Why this replica cannot serve right now; None when it can.
NotReadyReason = Callable[[], str | None]


def health_routes(not_ready: NotReadyReason) -> list[Route]:
    """`GET /health` (and HEAD), relative to the service's root."""

    async def health(request: Request) -> Response:
        reason = not_ready()
        if reason is None:
            return Response(status_code=200)
        return JSONResponse({"error": reason}, status_code=503)

    return [Route("/health", health, methods=["GET"])]
