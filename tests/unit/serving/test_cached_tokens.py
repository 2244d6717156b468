"""Cached prompt tokens: the engine's KV-cache block size (tests/unit/common/test_engine_config.py)
times the reused blocks of a request's last response (the C++ backend's reused blocks, the LLM-API model's `cached_tokens`),
carried by the core's result to the usage of every API; 0 where the engine cannot tell.

The C++ backend does not run on this machine: a scripted engine stands in for it, answering
with the real tritonclient response objects that backend sends (output ids, sequence length,
and on the last response its perf metrics)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from triton_results import result

from tensorrtllm_backend.common.engine_api import EngineResult
from tensorrtllm_backend.common.engine_config import EngineInfo
from tensorrtllm_backend.serving.chat.core import ChatCore
from tensorrtllm_backend.serving.chat.stream import answer_steps, collect
from tensorrtllm_backend.serving.generation import EngineLimits, Generator
from tensorrtllm_backend.serving.openai_api.protocol import ChatCompletionRequest
from tensorrtllm_backend.serving.openai_api.serving import OpenAIServing
from tensorrtllm_backend.serving.schemas import SamplingParams
from tensorrtllm_backend.serving.triton_paths import Route, make_route
from tensorrtllm_backend.serving.triton_paths.direct import REUSED_BLOCKS

BLOCK = 64


def response(ids: list[int], **scalars: int) -> EngineResult:
    """A tensorrt_llm response: new token ids, their count, and INT32 scalars (perf metrics)."""
    outputs = {
        "output_ids": np.asarray([[ids]], np.int32),
        "sequence_length": np.asarray([[len(ids)]], np.int32),
        **{name: np.asarray([[value]], np.int32) for name, value in scalars.items()},
    }
    return result(**outputs)


class ScriptedEngine:
    """An InferenceEngine answering every request with the same responses."""

    open_streams = 0
    responses_received = 0

    def __init__(self, responses: list[EngineResult]) -> None:
        self.responses = responses
        self.requests: list[tuple[Mapping[str, np.ndarray], Sequence[str]]] = []

    async def stream(
        self, model_name: str, tensors: Mapping[str, np.ndarray], outputs: Sequence[str],
        request_id: str,
    ) -> AsyncGenerator[EngineResult, None]:  # fmt: skip
        self.requests.append((tensors, outputs))
        for response in self.responses:
            yield response

    def let_finish(self, responses: AsyncGenerator[Any, None], *args: Any) -> None:
        pass

    async def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("kind", "per_block"), [("tensorrt_llm", BLOCK), ("cpu", BLOCK), ("cpu", None)]
)
def test_engines_that_report_reused_blocks_count_them(kind: str, per_block: int | None) -> None:
    """The C++ backend and the CPU engine (its prefix cache) report reused blocks of their
    block size; an engine config without one (a CPU engine packed before) counts none."""
    info = EngineInfo(
        kind=kind, path=Path("/engine"), max_batch_size=8, max_input_len=64, max_seq_len=128,
        tokens_per_block=per_block,
    )  # fmt: skip
    assert EngineLimits.from_engine(info).tokens_per_block == per_block


def test_the_direct_route_asks_for_reused_blocks_where_it_can_count_them(demo_tokenizer) -> None:
    route = make_route(Route.DIRECT, demo_tokenizer)
    generator = Generator(ScriptedEngine([]), demo_tokenizer, EngineLimits(64, 128))
    prepared = generator.prepare("Once upon", SamplingParams(max_tokens=2))
    tensors, outputs = route.inputs(prepared, None)
    assert "return_perf_metrics" not in tensors and REUSED_BLOCKS not in outputs
    route.tokens_per_block = BLOCK
    tensors, outputs = route.inputs(prepared, None)
    assert tensors["return_perf_metrics"].item() and REUSED_BLOCKS in outputs
    assert route.cached_tokens(response([5], **{REUSED_BLOCKS: 3})) == 3 * BLOCK
    assert route.cached_tokens(response([5])) == 0


def test_the_llmapi_models_count_is_read_as_it_is(demo_tokenizer) -> None:
    route = make_route(Route.LLMAPI, demo_tokenizer)
    assert route.cached_tokens(response([5], cached_tokens=17)) == 17
    assert route.cached_tokens(response([5])) == 0


@pytest.mark.parametrize(("per_block", "cached"), [(BLOCK, 2 * BLOCK), (None, 0)])
async def test_every_api_reports_the_cached_tokens(
    demo_tokenizer, per_block: int | None, cached: int
) -> None:
    engine = ScriptedEngine([response([300]), response([301], **{REUSED_BLOCKS: 2})])
    limits = EngineLimits(256, 512, tokens_per_block=per_block)
    generator = Generator(engine, demo_tokenizer, limits)
    prepared = generator.prepare("Once upon", SamplingParams(max_tokens=2))
    assert (
        await collect(prepared, answer_steps(generator, prepared))
    ).usage.cached_tokens == cached
    serving = OpenAIServing(ChatCore(generator, "demo"))
    request = ChatCompletionRequest.model_validate(
        {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    )
    chat_prepared, plan = await serving.prepare_chat(request)
    answer = await serving.chat(chat_prepared, plan)
    assert answer.usage.prompt_tokens_details is not None
    assert answer.usage.prompt_tokens_details.cached_tokens == cached
