"""Quantized models end to end: pack_model.py quantizes the demo with NVIDIA ModelOpt at pack
time (`--demo --quantize fp8`; the demo wide enough for INT4 AWQ blocks, `--demo-size awq
--quantize int4_awq`), `bentoml serve` serves each through the CPU stand-in, which dequantizes
the stored tensors at load (in the `tensorrt_llm` slot of the engine workflow, and behind our
llmapi model for `--workflow llmapi`), and the official `openai` client's greedy completions for 16
prompts are those of ModelOpt's own fake-quantized model, computed here
(tests/quantized_reference.py). /v1/models says what the model is quantized to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import bentoml
import pytest
from conftest import CLIENT_TIMEOUT_S, BentoServer, openai_client, pack, start_bento_server
from safetensors.torch import load_file

from tests.quantized_reference import (
    CALIB_SIZE,
    NEW_TOKENS,
    QuantizedDemo,
    prompt_ids,
    quantized_demo,
)

pytestmark = pytest.mark.integration

# --quantize, --demo-size, the quant_algo the export records, and the workflow of each case.
CASES = {
    "fp8": ("fp8", "tiny", "FP8", "engine"),
    "int4_awq": ("int4_awq", "awq", "W4A16_AWQ", "engine"),
    "llmapi-fp8": ("fp8", "tiny", "FP8", "llmapi"),
}
LIMITS = ("--max-input-len", "256", "--max-seq-len", "512")


class Served(NamedTuple):
    name: str
    algorithm: str  # the quant_algo the export records
    reference: QuantizedDemo
    server: BentoServer


@pytest.fixture(scope="module", params=list(CASES))
def served(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Served]:
    fmt, size, algorithm, workflow = CASES[request.param]
    case = request.param.replace("_", "-")
    reference = quantized_demo(tmp_path_factory.mktemp(f"reference-{case}"), fmt, size=size)
    name = f"trtllm-demo-{case}-it"
    tag = pack("--demo", "--demo-size", size, "--quantize", fmt, "--calib-size", str(CALIB_SIZE),
               "--workflow", workflow, "--name", name, *LIMITS)  # fmt: skip
    server = start_bento_server(tag, tmp_path_factory.mktemp(f"server-{case}"))
    yield Served(name, algorithm, reference, server)
    server.stop()
    bentoml.models.delete(tag)


def test_the_stored_weights_are_the_references(served: Served) -> None:
    """Pack time quantized the demo as the test did: the same calibration, the same tensors."""
    stored = next(Path(bentoml.models.get(served.name).path).rglob("hf_quant_config.json")).parent
    ours = load_file(str(served.reference.checkpoint / "model.safetensors"))
    theirs = load_file(str(stored / "model.safetensors"))
    assert ours.keys() == theirs.keys()
    assert all(ours[key].equal(theirs[key]) for key in ours)


def test_greedy_completions_are_the_fake_quantized_models(served: Served) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(served.reference.checkpoint))
    client = openai_client(served.server, CLIENT_TIMEOUT_S)
    result = client.completions.create(
        model=served.name, prompt=prompt_ids(tokenizer), max_tokens=NEW_TOKENS, temperature=0,
        extra_body={"ignore_eos": True},  # the reference runs past an end token too
    )  # fmt: skip
    texts = [choice.text for choice in sorted(result.choices, key=lambda c: c.index)]
    expected = [
        tokenizer.decode(ids, skip_special_tokens=True) for ids in served.reference.reference
    ]
    assert texts == expected
    assert result.usage.completion_tokens == NEW_TOKENS * len(expected)


def test_models_show_the_quantization(served: Served) -> None:
    client = openai_client(served.server, CLIENT_TIMEOUT_S)
    (card,) = client.models.list().data
    quantization = card.model_extra["quantization"]
    assert quantization["algorithm"] == served.algorithm
    assert quantization["source"] == "hf_quant_config.json"
