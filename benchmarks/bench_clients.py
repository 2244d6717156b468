"""The load generator: one streaming client per target and a fixed-concurrency driver.

Every client turns one request into a :class:`RequestRecord`; failures are recorded, never
raised, so one bad request does not end a run. Token counting per target:
- grpc_direct: tokens in output_ids of each `tensorrt_llm` response;
- triton_generate_stream: one token per SSE event (the synthetic engine sends one per step);
- native / baseline: text chunks, checked against the text the engine must produce;
- openai: completion_tokens of the include_usage chunk, and the text is checked as well.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
import numpy as np

from tensorrtllm_backend.common.engine_api import EngineResult
from tensorrtllm_backend.serving.triton_paths.direct import new_token_ids
from tensorrtllm_backend.triton.client import TritonLLMClient

from .bench_stats import RequestRecord

NO_END_ID = -1  # never stop on an end token: every request yields exactly max_tokens
DIRECT_OUTPUTS = ("output_ids", "sequence_length")


@dataclass(frozen=True, slots=True)
class PromptCase:
    """A prompt and what a complete answer looks like (None: unknown, e.g. a remote model)."""

    text: str
    ids: tuple[int, ...]
    # Complete answers by kind: "decode" (the whole decode of the engine's tokens: the direct
    # route's text) and, per Triton text model ("ensemble", "tensorrt_llm_bls"), the text that
    # model streams, concatenated (its postprocessing decodes token by token).
    expected: Mapping[str, str] = field(default_factory=dict)

    def expected_text(self, kind: str | None) -> str | None:
        return self.expected.get(kind) if kind else None


RequestFn = Callable[[PromptCase], Awaitable[RequestRecord]]


def judge_text(
    received: str, expected: str | None, max_tokens: int, chunks: int
) -> tuple[int, bool, bool]:
    """(tokens, short, mismatch) of a text answer.

    Complete text counts max_tokens; shorter text counts the share of the expected text that
    arrived as a common prefix. Without an expectation, each non-empty chunk counts one token.
    """
    if expected is None:
        return chunks, chunks < max_tokens, False
    if received == expected:
        return max_tokens, False, False
    if len(received) < len(expected):
        prefix = len(os.path.commonprefix([received, expected]))
        return (max_tokens * prefix) // max(len(expected), 1), True, False
    return max_tokens, False, True


async def run_load(
    request: RequestFn, prompts: Sequence[PromptCase], n: int, concurrency: int
) -> tuple[list[RequestRecord], float]:
    """n requests, at most `concurrency` in flight; returns the records and the wall time."""
    records: list[RequestRecord] = []
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < n:
            index = next_index
            next_index += 1
            records.append(await request(prompts[index % len(prompts)]))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))
    return records, time.perf_counter() - started


async def run_open_loop(
    request: RequestFn, prompts: Sequence[PromptCase], n: int, rate: float, seed: int = 0
) -> tuple[list[RequestRecord], float]:
    """n requests arriving as a Poisson process of `rate` per second, whatever is in flight.

    A closed loop sends each request when another ends, i.e. right after a last token, which
    locks arrivals to the engine's step; open-loop arrivals land at any phase of it.
    """
    arrivals = random.Random(seed)
    started = time.perf_counter()
    in_flight = []
    for index in range(n):
        in_flight.append(asyncio.ensure_future(request(prompts[index % len(prompts)])))
        await asyncio.sleep(arrivals.expovariate(rate))
    records = list(await asyncio.gather(*in_flight))
    return records, time.perf_counter() - started


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


# -- (a) Triton gRPC, tensorrt_llm with token ids: the floor ----------------------------------
def exact_length_tensors(ids: Sequence[int], max_tokens: int, pad_id: int) -> dict[str, np.ndarray]:
    """tensorrt_llm's inputs for a streamed request of exactly max_tokens tokens."""
    return {
        "input_ids": np.array([ids], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[max_tokens]], dtype=np.int32),
        "end_id": np.array([[NO_END_ID]], dtype=np.int32),
        "pad_id": np.array([[pad_id]], dtype=np.int32),
        "streaming": np.array([[True]], dtype=np.bool_),
    }


class GrpcDirect:
    """The service's own gRPC client (TritonLLMClient: one shared channel, the same call) with
    nothing in front of it, like a lean in-process caller: what the service adds is then only
    what it does besides talking to Triton."""

    def __init__(self, url: str, max_tokens: int, pad_id: int) -> None:
        self.client = TritonLLMClient(url)
        self.max_tokens = max_tokens
        self.pad_id = pad_id
        self._count = 0

    async def close(self) -> None:
        await self.client.close()

    async def __call__(self, prompt: PromptCase) -> RequestRecord:
        tensors = exact_length_tensors(prompt.ids, self.max_tokens, self.pad_id)
        return await self.request(tensors, DIRECT_OUTPUTS)

    async def request(
        self,
        tensors: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        on_result: Callable[[EngineResult], None] | None = None,
    ) -> RequestRecord:
        """One request with these inputs; `on_result` sees every response."""
        self._count += 1
        record = RequestRecord(start=time.perf_counter(), end=0.0, expected_tokens=self.max_tokens)
        try:
            async for result in self.client.stream(
                "tensorrt_llm", tensors, outputs, f"bench-{self._count}"
            ):
                # The service's own parse of a response: the floor's CPU per token is then
                # what receiving costs, not numpy's overhead.
                count = len(new_token_ids(result))
                if count:
                    now = time.perf_counter()
                    record.first_output = record.first_output or now
                    record.last_output = now
                    record.tokens += count
                if on_result is not None:
                    on_result(result)
        except Exception as error:  # recorded: a run reports errors instead of stopping
            record.error = _error_text(error)
        record.end = time.perf_counter()
        record.short = record.error is None and record.tokens < self.max_tokens
        return record


class GrpcEnsemble:
    """Text through NVIDIA's `ensemble` over gRPC, as a client of Triton's own API sends it (the
    same channel and call as GrpcDirect): one token per streamed response, the text checked
    against the ensemble's reference answer. No request id, as that reference was taken: the
    postprocessing then decodes each response alone, NVIDIA's own behaviour."""

    def __init__(self, url: str, max_tokens: int) -> None:
        self.client = TritonLLMClient(url)
        self.max_tokens = max_tokens

    async def close(self) -> None:
        await self.client.close()

    async def __call__(self, prompt: PromptCase) -> RequestRecord:
        tensors = {
            "text_input": np.array([[prompt.text.encode()]], dtype=np.object_),
            "max_tokens": np.array([[self.max_tokens]], dtype=np.int32),
            "stream": np.array([[True]], dtype=np.bool_),
            "end_id": np.array([[NO_END_ID]], dtype=np.int32),
        }
        record = RequestRecord(start=time.perf_counter(), end=0.0, expected_tokens=self.max_tokens)
        parts: list[str] = []
        try:
            async for result in self.client.stream("ensemble", tensors, ("text_output",), ""):
                output = result.values("text_output")
                text = output[0] if output else ""
                if text:
                    now = time.perf_counter()
                    record.first_output = record.first_output or now
                    record.last_output = now
                    parts.append(text)
        except Exception as error:
            record.error = _error_text(error)
        record.end = time.perf_counter()
        if record.error is None:
            record.tokens, record.short, record.mismatch = judge_text(
                "".join(parts), prompt.expected_text("ensemble"), self.max_tokens, len(parts)
            )
        return record


# -- HTTP streaming clients -------------------------------------------------------------------
def http_client(concurrency: int) -> aiohttp.ClientSession:
    """The load generator shares the machine's cores with the servers it measures, so it must be
    cheap per chunk: with 128 streams, httpx's connection pool and async iterators alone held our
    native stream to ~2.9k tok/s where aiohttp read ~4.3k tok/s from the same server."""
    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=600.0, connect=30.0)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


async def _raw_chunks(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    async for raw in response.content.iter_any():
        yield raw


async def _error_status(response: aiohttp.ClientResponse) -> RuntimeError:
    return RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")


async def _sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The data payloads of a server-sent-event stream, split from the raw bytes (every target is
    read as bytes as they arrive; no line iterator or text decoder per chunk)."""
    buffer = b""
    async for raw in chunks:
        buffer += raw
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    yield line[5:].strip().decode()
    for line in buffer.split(b"\n"):  # a last event without its blank line
        if line.startswith(b"data:"):
            yield line[5:].strip().decode()


class TritonGenerateStream:
    """(b) POST /v2/models/<model>/generate_stream: one SSE event per engine step."""

    def __init__(self, client: aiohttp.ClientSession, base_url: str, max_tokens: int,
                 model: str = "ensemble") -> None:  # fmt: skip
        self.client = client
        self.url = f"{base_url}/v2/models/{model}/generate_stream"
        self.max_tokens = max_tokens

    async def __call__(self, prompt: PromptCase) -> RequestRecord:
        body = {"text_input": prompt.text, "max_tokens": self.max_tokens, "stream": True,
                "end_id": NO_END_ID}  # fmt: skip
        record = RequestRecord(start=time.perf_counter(), end=0.0, expected_tokens=self.max_tokens)
        try:
            async with self.client.post(self.url, json=body) as response:
                if response.status != 200:
                    raise await _error_status(response)
                async for data in _sse_events(_raw_chunks(response)):
                    event = json.loads(data)
                    if "error" in event:
                        raise RuntimeError(str(event["error"]))
                    if "text_output" in event:
                        now = time.perf_counter()
                        record.first_output = record.first_output or now
                        record.last_output = now
                        record.tokens += 1
        except Exception as error:
            record.error = _error_text(error)
        record.end = time.perf_counter()
        record.short = record.error is None and record.tokens < self.max_tokens
        return record


class TextStream:
    """(c) our native POST /generate and (e) the baseline proxy: a plain stream of text chunks."""

    def __init__(self, client: aiohttp.ClientSession, url: str, max_tokens: int,
                 expect: str | None = "decode", native: bool = True,
                 count_tokens: Callable[[str], int] | None = None,
                 start_header: str | None = None) -> None:  # fmt: skip
        self.client = client
        self.url = url
        self.max_tokens = max_tokens
        self.expect = expect  # which PromptCase.expected text a complete answer equals
        self.native = native
        self.count_tokens = count_tokens  # without an expectation: tokens of the received text
        # A header carrying the request's start (repr of its perf_counter), for a server-side
        # probe to join its marks with the client's (benchmarks/ttft_breakdown.py).
        self.start_header = start_header

    def _body(self, prompt: PromptCase) -> dict[str, object]:
        if self.native:
            return {"prompt": prompt.text, "max_tokens": self.max_tokens, "ignore_eos": True}
        return {"prompt": prompt.text, "max_tokens": self.max_tokens}

    async def __call__(self, prompt: PromptCase) -> RequestRecord:
        record = RequestRecord(start=time.perf_counter(), end=0.0, expected_tokens=self.max_tokens)
        parts: list[str] = []
        chunks = 0
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        headers = {self.start_header: repr(record.start)} if self.start_header else None
        try:
            async with self.client.post(
                self.url, json=self._body(prompt), headers=headers
            ) as response:
                if response.status != 200:
                    raise await _error_status(response)
                async for raw in response.content.iter_any():
                    text = decoder.decode(raw)
                    if text:
                        now = time.perf_counter()
                        record.first_output = record.first_output or now
                        record.last_output = now
                        parts.append(text)
                        chunks += 1
                parts.append(decoder.decode(b"", final=True))
        except Exception as error:
            record.error = _error_text(error)
        record.end = time.perf_counter()
        if record.error is None:
            expected = prompt.expected_text(self.expect)
            received = "".join(parts)
            record.tokens, record.short, record.mismatch = judge_text(
                received, expected, self.max_tokens, chunks
            )
            if expected is None and self.count_tokens is not None:
                record.tokens = self.count_tokens(received)
                record.short = record.tokens < self.max_tokens
        return record


class OpenAICompletions:
    """(d) POST /v1/completions stream=true with include_usage."""

    def __init__(self, client: aiohttp.ClientSession, base_url: str, model: str, max_tokens: int,
                 expect: str | None = "decode") -> None:  # fmt: skip
        self.client = client
        self.url = f"{base_url}/v1/completions"
        self.model = model
        self.max_tokens = max_tokens
        self.expect = expect

    async def __call__(self, prompt: PromptCase) -> RequestRecord:
        body = {
            "model": self.model, "prompt": prompt.text, "max_tokens": self.max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
            "seed": 0,  # the engine's default: without it the OpenAI API draws a random seed
            # Greedy, as the gRPC and native requests (no sampling inputs) are: OpenAI's default
            # temperature of 1 would make the engine sample, other work than theirs per token.
            "temperature": 0,
        }  # fmt: skip
        record = RequestRecord(start=time.perf_counter(), end=0.0, expected_tokens=self.max_tokens)
        parts: list[str] = []
        usage_tokens: int | None = None
        try:
            async with self.client.post(self.url, json=body) as response:
                if response.status != 200:
                    raise await _error_status(response)
                async for data in _sse_events(_raw_chunks(response)):
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        raise RuntimeError(str(event["error"]))
                    if event.get("usage"):
                        usage_tokens = int(event["usage"]["completion_tokens"])
                    for choice in event.get("choices") or ():
                        if choice.get("text"):
                            now = time.perf_counter()
                            record.first_output = record.first_output or now
                            record.last_output = now
                            parts.append(choice["text"])
        except Exception as error:
            record.error = _error_text(error)
        record.end = time.perf_counter()
        if record.error is None:
            expected = prompt.expected_text(self.expect)
            text_tokens, short, mismatch = judge_text(
                "".join(parts), expected, self.max_tokens, len(parts)
            )
            record.tokens = usage_tokens if usage_tokens is not None else text_tokens
            text_short = short and expected is not None  # chunks are not tokens
            record.short = text_short or record.tokens < self.max_tokens
            record.mismatch = mismatch
        return record


def service_request(
    api: str, client: aiohttp.ClientSession, url: str, model: str, max_tokens: int,
    expect: str | None = "decode",
) -> RequestFn:  # fmt: skip
    """The request function of one of the service's streaming APIs at `url`: "native" (POST
    /generate) or "openai" (/v1/completions of `model`)."""
    if api == "native":
        return TextStream(client, f"{url}/generate", max_tokens, expect)
    if api == "openai":
        return OpenAICompletions(client, url, model, max_tokens, expect)
    raise ValueError(f"unknown service API {api!r}")


async def cached_prefix_turn(
    client: aiohttp.ClientSession, url: str, model: str, ids: list[int]
) -> tuple[float, int]:
    """One streamed /v1/completions request of token ids, 4 greedy tokens: (seconds to its first
    text, the prompt tokens the replica found in its prefix cache)."""
    body = {
        "model": model, "prompt": ids, "max_tokens": 4, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    started = time.perf_counter()
    first, cached = None, 0
    async with client.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise await _error_status(response)
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event["choices"] and first is None:
                first = time.perf_counter() - started
            if event.get("usage"):
                cached = event["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first is not None
    return first, cached
