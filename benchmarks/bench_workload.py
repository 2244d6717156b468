"""The prompts of a run and the complete answers the synthetic engine must give to them.

The synthetic engine's tokens are a function of the prompt's ids (cpu_engine.synthetic), so the
direct route's text is known before any request. The text models (ensemble, BLS) decode token by
token in their postprocessing, which differs from a whole decode for byte tokens; their complete
answer is taken from one reference request each, accepted only if it had max_tokens responses.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcclient

from tensorrtllm_backend.common.tokenization import decode, load_tokenizer
from tensorrtllm_backend.python_models.cpu_engine.synthetic import predict_tokens
from tensorrtllm_backend.triton.client import make_inputs

from .bench_clients import NO_END_ID, PromptCase

REPLACEMENT = "\ufffd"
PROMPT_TEMPLATE = "Benchmark request {}: tell me a long story about a lighthouse keeper and the sea"


class WorkloadError(RuntimeError):
    """The model cannot give the answers the benchmark needs to check completeness."""


def engine_settings(model_root: Path) -> dict[str, Any]:
    config = json.loads((model_root / "engines" / "config.json").read_text())
    cpu = config.get("cpu_engine") or {}
    if cpu.get("mode") != "synthetic":
        raise WorkloadError(f"{model_root} is not a synthetic CPU engine")
    return {
        "vocab_size": int(config["pretrained_config"]["vocab_size"]),
        "eos_token_id": int(cpu.get("eos_token_id", 2)),
        "seed": int(cpu.get("seed", 0)),
    }


def build_prompts(model_root: Path, max_tokens: int, count: int = 8) -> list[PromptCase]:
    """`count` prompts whose first generated token is visible text.

    Time to first token is measured at the first visible output of each target; a first token
    that is a lone byte would make the text targets wait for the next one.
    """
    tokenizer = load_tokenizer(model_root / "tokenizer")
    settings = engine_settings(model_root)
    cases: list[PromptCase] = []
    for index in range(count * 50):
        text = PROMPT_TEMPLATE.format(index)
        ids = tokenizer.encode(text, add_special_tokens=True)  # as the service's generator does
        tokens = predict_tokens(list(ids), max_tokens, **settings)
        first = decode(tokenizer, tokens[:1])
        if not first.strip() or REPLACEMENT in first:
            continue
        cases.append(PromptCase(text, tuple(ids), {"decode": decode(tokenizer, tokens)}))
        if len(cases) == count:
            return cases
    raise WorkloadError(f"found only {len(cases)} prompts with a visible first token")


async def _reference_text(
    client: grpcclient.InferenceServerClient, model: str, prompt: str, max_tokens: int
) -> str:
    inputs = make_inputs(
        {
            "text_input": np.array([[prompt.encode()]], dtype=np.object_),
            "max_tokens": np.array([[max_tokens]], dtype=np.int32),
            "stream": np.array([[True]], dtype=np.bool_),
            "end_id": np.array([[NO_END_ID]], dtype=np.int32),
        }
    )

    async def one() -> AsyncIterator[dict[str, object]]:
        yield {"model_name": model, "inputs": inputs,
               "outputs": [grpcclient.InferRequestedOutput("text_output")]}  # fmt: skip

    parts: list[str] = []
    async for result, error in client.stream_infer(one()):
        if error is not None:
            raise WorkloadError(f"{model}: reference request failed: {error}")
        output = result.as_numpy("text_output")
        if output is not None and output.size:
            parts.append(output.reshape(-1)[0].decode("utf-8", "replace"))
    if len(parts) != max_tokens:
        raise WorkloadError(
            f"{model}: reference request streamed {len(parts)} responses, expected {max_tokens}"
        )
    return "".join(parts)


async def add_reference_texts(
    grpc_url: str, prompts: Sequence[PromptCase], models: Sequence[str], max_tokens: int
) -> list[PromptCase]:
    """The prompts with the text each Triton text model streams for them."""
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        updated = []
        for case in prompts:
            expected = dict(case.expected)
            for model in models:
                expected[model] = await _reference_text(client, model, case.text, max_tokens)
            updated.append(PromptCase(case.text, case.ids, expected))
        return updated
    finally:
        await client.close()
