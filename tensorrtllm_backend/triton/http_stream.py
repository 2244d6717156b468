"""Triton's HTTP ``generate_stream`` endpoint as a transport for token streams.

Why a second transport: receiving a streamed response costs a Python gRPC client 110–200 µs of
CPU (grpcio wakes its poller thread for every read it starts, and the poller wakes the event
loop for every message it receives), and that cost is most of what the service spends per
token. The same responses as server-sent events on one keep-alive HTTP/1.1 connection per
request cost about half: one socket read in the event loop and one ``json.loads`` each
(docs/performance.md, "Receiving a token"). Closing the connection cancels the request in
Triton, as cancelling the gRPC call does.

What it can carry: Triton's generate extension turns each JSON field into the input tensor of
that name and can shape only scalars and flat lists, i.e. tensors of at most one dimension
beyond a batch dimension of 1. :func:`generate_body` says which requests fit; the others (the
C++ backend's stop and bad word lists, [1, 2, L]; LoRA weights) go by gRPC
(:class:`~.client.TritonLLMClient` chooses per request).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import numpy as np

from ..common.engine_api import Tensors

# Requests with more input values go by gRPC: a JSON body of 64k token ids already costs a few
# milliseconds of the event loop to encode, where the binary protobuf costs microseconds.
MAX_JSON_VALUES = 1 << 16

# How long connecting to the loopback endpoint may take before the request fails as unavailable.
CONNECT_TIMEOUT_S = 5.0

_EVENT_END = b"\n\n"
_DATA = b"data: "


def generate_body(tensors: Tensors, request_id: str = "") -> bytes | None:
    """The JSON body of a ``generate_stream`` request with these input tensors, or None when the
    generate extension cannot carry them (an input of more than one dimension beyond a batch
    dimension of 1, a string that is not UTF-8) or they are large (MAX_JSON_VALUES)."""
    body: dict[str, Any] = {"id": request_id} if request_id else {}
    values = 0
    for name, array in tensors.items():
        if array.ndim > 2 or (array.ndim == 2 and array.shape[0] != 1):
            return None
        values += array.size
        if values > MAX_JSON_VALUES:
            return None
        flat = array.reshape(-1).tolist()
        if array.dtype == np.object_:
            try:
                flat = [v.decode() if isinstance(v, bytes) else str(v) for v in flat]
            except UnicodeDecodeError:
                return None
        body[name] = flat
    return json.dumps(body, separators=(",", ":")).encode()


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The JSON payloads of the complete server-sent events in `buffer`, and what follows them
    (the start of an event still arriving)."""
    *events, rest = buffer.split(_EVENT_END)
    return [event[len(_DATA) :] for event in events if event.startswith(_DATA)], rest


class GenerateError(Exception):
    """Triton refused or failed a ``generate_stream`` request before streaming it: its HTTP
    status and message. `in_stream`: the model's own error response (as the first event), not
    Triton's refusal of the request."""

    def __init__(self, status: int, message: str, in_stream: bool) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.in_stream = in_stream


def _error_message(body: bytes) -> tuple[str, bool]:
    """The message of an error answer, and whether it came as a server-sent event."""
    events, _ = split_events(body + _EVENT_END)
    try:
        if events:
            return str(json.loads(events[0]).get("error", body.decode())), True
        return str(json.loads(body).get("error", body.decode())), False
    except (ValueError, AttributeError):
        return body.decode("utf-8", "replace").strip(), False


class GenerateClient:
    """One aiohttp session to tritonserver's HTTP endpoint, opened on first use (inside the
    event loop), with one keep-alive connection per concurrent request."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                # No pool limit: the service's in-flight limit bounds the connections.
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                # No total timeout: a generation takes as long as it takes (the stall watchdog
                # restarts a tritonserver that stops answering).
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def open(self, model_name: str, body: bytes) -> aiohttp.ClientResponse:
        """Send the request; the response once Triton streams it (status 200). A refusal or a
        first response that is an error raises :class:`GenerateError`; a connection that fails
        raises aiohttp's error."""
        url = f"{self.url}/v2/models/{model_name}/generate_stream"
        headers = {"Content-Type": "application/json"}
        for attempt in range(2):
            try:
                response = await self._client().post(url, data=body, headers=headers)
                break
            except aiohttp.ServerDisconnectedError:
                # A keep-alive connection the server had closed while it sat in the pool: the
                # request never reached Triton. Once more, on a new connection.
                if attempt:
                    raise
        if response.status == 200:
            return response
        try:
            message, in_stream = _error_message(await response.read())
        finally:
            response.release()
        raise GenerateError(response.status, message, in_stream)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
