"""The LLM API workflow end to end on CPU: `pack_model.py --demo --workflow llmapi`, our llmapi
`tensorrt_llm` model in a real tritonserver called with NVIDIA's tensors (a request written for
NVIDIA's stock model gets NVIDIA's outputs) and with ours (token ids in, deltas out), and
`bentoml serve` answering the native and OpenAI APIs through it (the features shared with the
direct route are tested over both routes in test_openai_api.py, test_openai_structured.py and
test_guided_service.py)."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import bentoml
import httpx
import numpy as np
import openai
import pytest
import yaml
from conftest import BentoServer, engine_counters, pack, start_bento_server
from tritonclient.grpc import InferInput
from tritonclient.grpc.aio import InferenceServerClient

from tensorrtllm_backend.triton.command import TritonServerConfig, find_free_port
from tensorrtllm_backend.triton.localize import localize_repository
from tensorrtllm_backend.triton.supervisor import TritonSupervisor
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def llmapi_model() -> str:
    return pack("--demo", "--workflow", "llmapi", "--max-seq-len", "512")


@pytest.fixture(scope="module")
def triton(llmapi_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """tritonserver on the stored llmapi repository, localized as the service does."""
    root = Path(bentoml.models.get(llmapi_model).path)
    run = tmp_path_factory.mktemp("llmapi-triton")
    repository = localize_repository(root / "model_repository", run / "repo", root)
    supervisor = TritonSupervisor(
        TritonServerConfig(
            model_repository=repository,
            auto_complete_config=True,  # max_batch_size / decoupled come from model.yaml
            log_dir=run / "logs",
            startup_timeout_s=180,
        )
    )
    supervisor.start()
    try:
        yield supervisor.grpc_url
    finally:
        supervisor.stop()
        shutil.rmtree(run, ignore_errors=True)


def _input(name: str, value: np.ndarray) -> InferInput:
    datatype = {"object": "BYTES", "bool": "BOOL", "int32": "INT32", "uint64": "UINT64",
                "float32": "FP32"}[value.dtype.name]  # fmt: skip
    tensor = InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


async def _call(url: str, streaming: bool, **extra: np.ndarray) -> list[dict[str, str]]:
    """One request with NVIDIA's llmapi tensors (no batch dimension); every response's
    text_output and finish_reason, in order."""
    tensors = {
        "text_input": np.array([PROMPT.encode()], dtype=np.object_),
        "sampling_param_max_tokens": np.array([12], dtype=np.int32),
        "streaming": np.array([streaming]),
        "return_finish_reason": np.array([True]),
        "sampling_param_exclude_input_from_output": np.array([True]),
        **extra,
    }
    inputs = [_input(name, value) for name, value in tensors.items()]
    client = InferenceServerClient(url)

    async def requests() -> AsyncIterator[dict]:
        yield {"model_name": "tensorrt_llm", "inputs": inputs, "request_id": "llmapi-test"}

    responses = []
    try:
        async for result, error in client.stream_infer(requests(), stream_timeout=120):
            if error is not None:
                raise error
            responses.append(
                {
                    name: result.as_numpy(name).reshape(-1)[0].decode()
                    for name in ("text_output", "finish_reason", "stop_reason")
                    if result.as_numpy(name) is not None
                }
            )
            if responses[-1]["finish_reason"] != "None":
                break
    finally:
        await client.close()
    return responses


def test_model_takes_its_triton_config_from_model_yaml(triton: str) -> None:
    async def config() -> object:
        client = InferenceServerClient(triton)
        try:
            return (await client.get_model_config("tensorrt_llm")).config
        finally:
            await client.close()

    loaded = asyncio.run(config())
    assert loaded.max_batch_size == 0
    assert loaded.model_transaction_policy.decoupled is True
    assert {t.name for t in loaded.input} >= {"text_input", "sampling_param_max_tokens"}


def test_text_input_and_max_tokens_stream_text_so_far(triton: str) -> None:
    streamed = asyncio.run(_call(triton, streaming=True))
    texts = [r["text_output"] for r in streamed]
    assert len(streamed) > 2
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False))
    assert [r["finish_reason"] for r in streamed[:-1]] == ["None"] * (len(streamed) - 1)
    assert streamed[-1]["finish_reason"] == "length"
    whole = asyncio.run(_call(triton, streaming=False))  # greedy: the same text at once
    assert whole == [{"text_output": texts[-1], "finish_reason": "length"}]


def test_stop_string_ends_the_request(triton: str) -> None:
    full = asyncio.run(_call(triton, streaming=False))[0]["text_output"]
    stop = full.strip().split(" ")[1]  # a word from the middle of the greedy completion
    result = asyncio.run(
        _call(
            triton,
            streaming=True,
            sampling_param_stop=np.array([b"never in the text", stop.encode()], np.object_),
            return_stop_reason=np.array([True]),
        )
    )
    assert result[-1]["finish_reason"] == "stop"
    assert result[-1]["stop_reason"] == stop
    assert result[-1]["text_output"] == full[: full.index(stop)]
    assert all(r["stop_reason"] == "None" for r in result[:-1])


def test_seed_makes_sampling_repeatable(triton: str) -> None:
    def sampled(seed: int) -> str:
        extra = {
            "sampling_param_temperature": np.array([1.0], dtype=np.float32),
            "sampling_param_top_p": np.array([1.0], dtype=np.float32),
            "sampling_param_seed": np.array([seed], dtype=np.uint64),
        }
        return asyncio.run(_call(triton, streaming=False, **extra))[-1]["text_output"]

    assert sampled(7) == sampled(7)
    assert len({sampled(seed) for seed in (1, 2, 3)}) > 1


def test_bad_request_is_an_error_for_that_request(triton: str) -> None:
    with pytest.raises(Exception, match="sampling_param_max_tokens 100000"):
        asyncio.run(
            _call(triton, streaming=True, sampling_param_max_tokens=np.array([100000], np.int32))
        )


@pytest.fixture(scope="module")
def triton_ports() -> tuple[int, int]:
    """Triton's HTTP and metrics ports, fixed so that the tests can read them."""
    return find_free_port(), find_free_port()


@pytest.fixture(scope="module")
def server(
    llmapi_model: str,
    triton_ports: tuple[int, int],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[BentoServer]:
    server = start_bento_server(
        llmapi_model,
        tmp_path_factory.mktemp("llmapi-server"),
        env={  # to look at Triton's model and count what it served
            "TRTLLM_TRITON_HTTP_PORT": str(triton_ports[0]),
            "TRTLLM_TRITON_METRICS_PORT": str(triton_ports[1]),
        },
    )
    yield server
    server.stop()


def _triton_model(port: int, what: str) -> dict:
    url = f"http://127.0.0.1:{port}/v2/models/tensorrt_llm/{what}"
    return httpx.get(url, timeout=10).json()


def test_stored_model_yaml_points_at_the_stored_checkpoint(llmapi_model: str) -> None:
    root = Path(bentoml.models.get(llmapi_model).path)
    settings = yaml.safe_load(
        (root / "model_repository" / "tensorrt_llm" / "1" / "model.yaml").read_text()
    )
    assert settings["model"] == "checkpoint" and (root / "checkpoint" / "config.json").is_file()
    assert settings["max_seq_len"] == 512


def test_generate_streams_through_the_llmapi_model(
    server: BentoServer, triton_ports: tuple[int, int]
) -> None:
    http_port, metrics_port = triton_ports
    config = _triton_model(http_port, "config")
    assert {t["name"] for t in config["input"]} >= {"text_input", "sampling_param_max_tokens"}
    assert config["model_transaction_policy"]["decoupled"] is True

    def served() -> int:
        """Requests tensorrt_llm has served, by Triton's own metric (published every 2 s)."""
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        found = re.search(
            r'^nv_inference_request_success\{model="tensorrt_llm",version="1"\} (\S+)$', text, re.M
        )
        return int(float(found.group(1))) if found else 0

    before = served()
    body = {"prompt": PROMPT, "max_tokens": 16}
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=120) as response:
        assert response.status_code == 200
        chunks = [chunk for chunk in response.iter_text() if chunk]
    assert len(chunks) > 1
    result = httpx.post(f"{server.url}/generate_text", json=body, timeout=120).json()
    assert result["text"] == "".join(chunks)  # greedy: streamed and whole agree
    assert result["finish_reason"] == "length"
    assert result["usage"]["completion_tokens"] == 16
    # Both requests went to the llmapi tensorrt_llm model.
    assert wait_for(lambda: served() == before + 2, timeout=15)


def test_generate_text_cuts_at_stop_strings(server: BentoServer) -> None:
    body = {"prompt": PROMPT, "max_tokens": 16}
    full = httpx.post(f"{server.url}/generate_text", json=body, timeout=120).json()["text"]
    stop = full.strip().split(" ")[1]
    result = httpx.post(
        f"{server.url}/generate_text", json={**body, "stop": [stop]}, timeout=120
    ).json()
    assert result["text"] == full[: full.index(stop)]
    assert result["finish_reason"] == "stop"
    assert 0 < result["usage"]["completion_tokens"] <= 16


def test_openai_chat_completions_answer(server: BentoServer, llmapi_model: str) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    name = llmapi_model.split(":")[0]
    messages = [{"role": "user", "content": "Hi!"}]
    # The OpenAI API samples at temperature 1 by default: greedy makes both answers comparable.
    answer = client.chat.completions.create(
        model=name, messages=messages, max_tokens=8, temperature=0
    )
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model=name, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == answer.choices[0].message.content


TOKEN_OUTPUTS = ("output_ids", "output_top_token_ids", "finish_reason")


async def _token_call(url: str, **tensors: np.ndarray) -> list[dict[str, list]]:
    """One token-id request through the service's own client (gRPC); every response's
    TOKEN_OUTPUTS, flattened."""
    from tensorrtllm_backend.triton.client import TritonLLMClient

    client = TritonLLMClient(url)
    try:
        return [
            {name: result.values(name) for name in TOKEN_OUTPUTS}
            async for result in client.stream("tensorrt_llm", tensors, TOKEN_OUTPUTS, "ids")
        ]
    finally:
        await client.close()


def test_token_ids_in_deltas_out(triton: str, llmapi_model: str) -> None:
    """Ours: input_ids in, one response per step with the new ids, greedy as the text path."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        Path(bentoml.models.get(llmapi_model).path) / "tokenizer"
    )
    prompt = tokenizer.encode(PROMPT)
    responses = asyncio.run(
        _token_call(
            triton,
            text_input=np.array([b""], np.object_),
            input_ids=np.array(prompt, np.int32),
            streaming=np.array([True]),
            sampling_param_max_tokens=np.array([12], np.int32),
            sampling_param_exclude_input_from_output=np.array([True]),
            sampling_param_logprobs=np.array([2], np.int32),
            return_finish_reason=np.array([True]),
        )
    )
    ids = [token for response in responses for token in response["output_ids"]]
    assert len(ids) == 12 and len(responses) == 12
    # Two alternatives per new token, the chosen (greedy) one first.
    assert all(len(r["output_top_token_ids"]) == 2 * len(r["output_ids"]) for r in responses)
    assert all(r["output_top_token_ids"][0] == r["output_ids"][0] for r in responses)
    assert [r["finish_reason"] for r in responses][-1] == ["length"]
    text = asyncio.run(_call(triton, streaming=False))[0]["text_output"]
    assert tokenizer.decode(ids) == text


def test_a_request_with_both_prompts_is_refused(triton: str) -> None:
    with pytest.raises(Exception, match="send the prompt once"):
        asyncio.run(_token_call(triton, text_input=np.array([b"x"], np.object_),
                                input_ids=np.array([1, 2], np.int32)))  # fmt: skip


def test_guided_packed_by_default(llmapi_model: str) -> None:
    root = Path(bentoml.models.get(llmapi_model).path)
    settings = yaml.safe_load(
        (root / "model_repository" / "tensorrt_llm" / "1" / "model.yaml").read_text()
    )
    assert settings["guided_decoding_backend"] == "xgrammar"


def test_the_service_refuses_nvidias_stock_model(bento_launcher) -> None:
    """NVIDIA's model takes text only; the service's route sends token ids to ours."""
    tag = pack("--demo", "--workflow", "llmapi", "--llmapi-model", "nvidia",
               "--name", "trtllm-llmapi-nvidia", "--max-seq-len", "512")  # fmt: skip
    server = bento_launcher(tag)
    server.process.wait(120)  # `bentoml serve` stops instead of starting its worker again
    assert "the service cannot start" in server.log()
    assert "--llmapi-model nvidia" in server.log()


def test_a_client_that_leaves_stops_the_llmapi_model(bento_launcher) -> None:
    """Service -> Triton -> our model's cancellation watcher -> abort(): the CPU stand-in stops
    generating for a client that disconnected (its counters on Triton's metrics port)."""
    tag = pack("--synthetic", "--workflow", "llmapi", "--itl-ms", "50",
               "--name", "trtllm-llmapi-slow", "--max-input-len", "256", "--max-seq-len", "1024")  # fmt: skip
    metrics_port = find_free_port()
    server = bento_launcher(tag, {"TRTLLM_TRITON_METRICS_PORT": str(metrics_port)}, wait=True)
    before = engine_counters(metrics_port)
    body = {"prompt": PROMPT, "max_tokens": 500, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=30) as response:
        assert response.status_code == 200
        for received, _ in enumerate(response.iter_raw()):
            if received >= 2:
                break

    def stopped() -> bool:
        now = engine_counters(metrics_port)
        return (
            now.get("trtllm_cpu_engine_cancelled_requests_total", 0)
            > before.get("trtllm_cpu_engine_cancelled_requests_total", 0)
            and now.get("trtllm_cpu_engine_active_requests") == 0
        )

    assert wait_for(stopped, timeout=15), engine_counters(metrics_port)
