"""tensorrt_llm_bls and the ensemble with decoupled_mode=false (one response per request), on a
real tritonserver with the synthetic CPU engine. The decoupled (streaming) side is covered in
test_python_models.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from tensorrtllm_backend.common.cpu_engine_config import write_engine_dir
from tensorrtllm_backend.common.tokenization import decode
from tensorrtllm_backend.packing.repository import fill_repository
from tensorrtllm_backend.python_models.cpu_engine.synthetic import predict_tokens
from tensorrtllm_backend.triton.command import TritonServerConfig
from tensorrtllm_backend.triton.supervisor import TritonSupervisor

pytestmark = pytest.mark.integration

EOS_ID = 2


@pytest.fixture(scope="module")
def grpc_url(tmp_path_factory: pytest.TempPathFactory, demo_checkpoint: Path, demo_tokenizer):
    root = tmp_path_factory.mktemp("unary")
    engine = write_engine_dir(
        root / "engine", mode="synthetic", vocab_size=len(demo_tokenizer), eos_token_id=EOS_ID
    )
    repo = fill_repository(
        root / "repo",
        {
            "triton_backend": "python",
            "engine_dir": str(engine),
            "tokenizer_dir": str(demo_checkpoint),
            "decoupled_mode": "false",
            "accumulate_tokens": "true",  # meaningless without streaming: must not matter
        },
    )
    supervisor = TritonSupervisor(
        TritonServerConfig(
            model_repository=repo, restart=False, startup_timeout_s=180, log_dir=root / "logs"
        )
    )
    try:
        supervisor.start()
        yield supervisor.grpc_url
    finally:
        supervisor.stop()


def _inputs(prompt: str, max_tokens: int, **extra) -> list[grpcclient.InferInput]:
    values = {
        "text_input": (np.array([[prompt.encode()]], dtype=object), "BYTES"),
        "max_tokens": (np.array([[max_tokens]], dtype=np.int32), "INT32"),
    }
    if "stream" in extra:
        values["stream"] = (np.array([[extra["stream"]]]), "BOOL")
    if "stop_words" in extra:
        values["stop_words"] = (
            np.array([[w.encode() for w in extra["stop_words"]]], object),
            "BYTES",
        )
    inputs = []
    for name, (value, dtype) in values.items():
        item = grpcclient.InferInput(name, list(value.shape), dtype)
        item.set_data_from_numpy(value)
        inputs.append(item)
    return inputs


async def _text(url: str, model: str, prompt: str, max_tokens: int, **extra) -> str:
    async with grpcclient.InferenceServerClient(url) as client:
        result = await client.infer(model, _inputs(prompt, max_tokens, **extra))
    return result.as_numpy("text_output").reshape(-1)[0].decode("utf-8")


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
async def test_unary_text_matches_engine_tokens(grpc_url: str, demo_tokenizer, model: str) -> None:
    prompt = "Die Stadt erwachte langsam. Äpfel, Käse"
    ids = predict_tokens(
        demo_tokenizer.encode(prompt), 20, vocab_size=len(demo_tokenizer), eos_token_id=EOS_ID
    )
    assert await _text(grpc_url, model, prompt, 20) == decode(demo_tokenizer, ids).rstrip("\ufffd")


async def test_unary_bls_stop_string(grpc_url: str, demo_tokenizer) -> None:
    prompt = "Die Stadt erwachte langsam."
    full = await _text(grpc_url, "tensorrt_llm_bls", prompt, 40)
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = await _text(grpc_url, "tensorrt_llm_bls", prompt, 40, stop_words=[stop])
    assert cut == full[: full.index(stop)]


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
async def test_unary_rejects_streaming_and_empty_prompt(grpc_url: str, model: str) -> None:
    with pytest.raises(InferenceServerException, match="decoupled"):
        await _text(grpc_url, model, "hello", 4, stream=True)
    with pytest.raises(InferenceServerException, match="prompt is empty"):
        await _text(grpc_url, model, "", 4)
