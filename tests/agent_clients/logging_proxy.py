"""A logging reverse proxy for tests of real clients: it forwards every request to the service
unchanged, streams the answer back as it comes, and records each exchange (method, path, status,
the request's JSON body) in a JSON-lines file. A test then knows exactly what a client sent, and
that every exchange was answered 2xx.

    python -m tests.agent_clients.logging_proxy --upstream http://127.0.0.1:3000 \\
        --port 0 --log exchanges.jsonl        # prints the port it listens on
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding"}
)


def build_app(upstream: str, log: Path) -> web.Application:
    session: dict[str, aiohttp.ClientSession] = {}

    async def start(app: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
        session["client"] = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)

    async def stop(app: web.Application) -> None:
        await session["client"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        record: dict[str, Any] = {"method": request.method, "path": request.path_qs}
        try:
            record["body"] = json.loads(body) if body else None
        except ValueError:
            record["body"] = body[:2000].decode("utf-8", "replace")
        async with session["client"].request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as answer:
            record["status"] = answer.status
            error = await answer.read() if answer.status >= 400 else None  # short: read whole
            if error is not None:
                record["answer"] = error[-4000:].decode("utf-8", "replace")
            # Recorded as soon as the status is known: a client may leave once it has read the
            # end of a stream, before the proxy finishes it.
            with log.open("a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")
            response = web.StreamResponse(status=answer.status)
            for key, value in answer.headers.items():
                if key.lower() not in HOP_HEADERS and key.lower() != "content-encoding":
                    response.headers[key] = value
            await response.prepare(request)
            if error is not None:
                await response.write(error)
            else:
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
            await response.write_eof()
        return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


async def serve(upstream: str, port: int, log: Path) -> None:
    runner = web.AppRunner(build_app(upstream.rstrip("/"), log))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(bound, flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args.upstream, args.port, args.log))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
