"""TritonLLMClient.let_finish: a stream the caller left is read to its own end when that end is
near, and cancelled (closed early) only when it is not. tritonserver before r24.12 can crash when a
cancellation races with a request's own end (server#7840), so the near-end case must not cancel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from tensorrtllm_backend.common.engine_api import DRAIN_RESPONSES, EngineError
from tensorrtllm_backend.common.tokenization import StopStringMatcher
from tensorrtllm_backend.serving.generation import Generator
from tensorrtllm_backend.serving.sequence_state import SequenceState
from tensorrtllm_backend.triton.client import TritonLLMClient


@dataclass
class FakeStream:
    """A response stream that records whether it ran to its end or was closed before."""

    responses: int
    delay_s: float = 0.0
    fail: bool = False
    read: int = 0
    ended: bool = False
    closed_early: bool = False
    events: list[str] = field(default_factory=list)

    async def __call__(self) -> AsyncIterator[int]:
        try:
            for index in range(self.responses):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                self.read += 1
                yield index
            if self.fail:
                raise EngineError("stream broke")
            self.ended = True
        finally:
            if not self.ended:
                self.closed_early = True  # client.stream cancels the gRPC call here


@pytest.fixture
async def client() -> AsyncIterator[TritonLLMClient]:
    client = TritonLLMClient("127.0.0.1:1")  # never connected: streams are fakes
    yield client
    await client.close()


async def settle(client: TritonLLMClient) -> None:
    await asyncio.gather(*client._finishing)


async def test_a_stream_near_its_end_is_read_to_the_end(client: TritonLLMClient) -> None:
    stream = FakeStream(responses=DRAIN_RESPONSES)
    client.let_finish(stream())
    await settle(client)
    assert stream.ended and not stream.closed_early and stream.read == DRAIN_RESPONSES


async def test_a_stream_that_runs_on_is_cancelled(client: TritonLLMClient) -> None:
    stream = FakeStream(responses=100)
    client.let_finish(stream())
    await settle(client)
    assert stream.closed_early and stream.read == DRAIN_RESPONSES + 1


async def test_a_stalled_stream_is_cancelled_after_the_timeout(client: TritonLLMClient) -> None:
    stream = FakeStream(responses=3, delay_s=10.0)
    client.let_finish(stream(), timeout_s=0.05)
    await asyncio.wait_for(settle(client), 2.0)
    assert stream.closed_early and stream.read == 0


async def test_a_failing_stream_is_dropped_quietly(client: TritonLLMClient) -> None:
    stream = FakeStream(responses=1, fail=True)
    client.let_finish(stream())
    await settle(client)  # no exception escapes the background task
    assert stream.read == 1 and not client._finishing


async def test_close_cancels_what_is_still_draining() -> None:
    client = TritonLLMClient("127.0.0.1:1")
    stream = FakeStream(responses=3, delay_s=10.0)
    client.let_finish(stream())
    await asyncio.sleep(0)
    await asyncio.wait_for(client.close(), 2.0)
    assert stream.closed_early and not client._finishing


def _sequences(generated: list[int]) -> list[SequenceState]:
    sequences = []
    for index, count in enumerate(generated):
        sequence = SequenceState(index, None, StopStringMatcher([]))  # type: ignore[arg-type]
        sequence.generated = count
        sequences.append(sequence)
    return sequences


@pytest.mark.parametrize(
    ("max_tokens", "generated", "drained"),
    [
        (16, [15], True),  # one token and the final response left: let it end
        (16, [16 - DRAIN_RESPONSES + 1], True),
        (16, [16 - DRAIN_RESPONSES], False),  # too far from the end: cancel now
        (16, [2], False),
        (16, [16 - DRAIN_RESPONSES // 2 + 1] * 2, True),
        (16, [15, 10], False),
    ],
)
async def test_a_left_stream_is_cancelled_unless_its_end_is_near(
    client: TritonLLMClient, max_tokens: int, generated: list[int], drained: bool
) -> None:
    generator = Generator.__new__(Generator)  # only the client is used by _release
    generator.client = client
    # each sequence's remaining tokens and a final response, after the one already read
    left = sum(max_tokens - count for count in generated) + len(generated)
    stream = FakeStream(responses=1 + left)
    results = stream()
    await anext(results)  # started, as a stream the caller was reading
    await generator._release(results, _sequences(generated), max_tokens)
    await settle(client)
    assert stream.ended is drained and stream.closed_early is not drained
