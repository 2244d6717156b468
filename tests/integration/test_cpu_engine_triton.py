"""The CPU engine behind a real tritonserver (python backend, the filled tensorrt_llm template),
driven with tritonclient.grpc.aio (and the service's own TritonLLMClient): streaming,
non-streaming, concurrency, cancellation, errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
grpcclient = pytest.importorskip("tritonclient.grpc.aio")
from tritonclient.grpc import InferInput, InferRequestedOutput  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from tensorrtllm_backend.common.cpu_engine_config import write_engine_dir  # noqa: E402
from tensorrtllm_backend.common.engine_api import EngineModelError, EngineUnavailableError  # noqa: E402
from tensorrtllm_backend.packing.demo import build_demo_checkpoint  # noqa: E402
from tensorrtllm_backend.packing.repository import fill_repository  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.synthetic import predict_tokens  # noqa: E402
from tensorrtllm_backend.triton.client import TritonLLMClient  # noqa: E402
from tensorrtllm_backend.triton.command import TritonServerConfig, models_not_ready  # noqa: E402
from tensorrtllm_backend.triton.supervisor import TritonSupervisor  # noqa: E402

pytestmark = pytest.mark.integration

VOCAB = 2048
EOS = 2
FAST = "tensorrt_llm"  # synthetic, ITL 0, max_input_len 64
SLOW = "trtllm_slow"  # synthetic, ITL 5 ms, one batch slot (queueing / cancellation)
SYNC = "trtllm_sync"  # synthetic, non-decoupled model transaction policy
HF = "trtllm_hf"  # demo checkpoint through transformers
MULTI = "trtllm_multi"  # synthetic, ITL 5 ms, 4 batch slots (num_return_sequences, cancellation)
INTERVAL = "trtllm_interval"  # synthetic, ITL 0, the template's stream_interval filled with 4
# Template options beyond the backend, the engine and the policy, per model.
OPTIONS = {INTERVAL: {"stream_interval": "4"}}


def _add_model(repo: Path, name: str, engine_dir: Path, *, decoupled: bool, work: Path) -> None:
    """Fill the real tensorrt_llm template for the CPU engine and install it under `name`."""
    filled = fill_repository(
        work / f"fill-{name}",
        {
            "triton_backend": "python",
            "engine_dir": str(engine_dir),
            "decoupled_mode": decoupled,
            **OPTIONS.get(name, {}),
        },
        models=("tensorrt_llm",),
    )
    target = repo / name
    shutil.move(str(filled / "tensorrt_llm"), target)
    config = target / "config.pbtxt"
    text = re.sub(r'^name: "tensorrt_llm"', f'name: "{name}"', config.read_text(), flags=re.M)
    config.write_text(text)


# The synthetic engines differ only in these settings (vocabulary and EOS are shared).
SYNTHETIC = {
    FAST: {"max_input_len": 64, "max_seq_len": 2048},
    SLOW: {"itl_ms": 5, "max_batch_size": 1},
    SYNC: {},
    MULTI: {"itl_ms": 5, "max_batch_size": 4},
    INTERVAL: {},
}


@pytest.fixture(scope="module")
def engine_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu-engines")
    ckpt = build_demo_checkpoint(root / "demo-ckpt")
    dirs = {
        name: write_engine_dir(
            root / name, mode="synthetic", vocab_size=VOCAB, eos_token_id=EOS, **settings
        )
        for name, settings in SYNTHETIC.items()
    }
    dirs[HF] = write_engine_dir(
        root / "hf", mode="hf", checkpoint_dir=ckpt, vocab_size=VOCAB, eos_token_id=EOS
    )
    return dirs


@pytest.fixture(scope="module")
def triton(engine_dirs, tmp_path_factory):
    work = tmp_path_factory.mktemp("triton")
    repo = work / "repo"
    repo.mkdir()
    for name, engine_dir in engine_dirs.items():
        _add_model(repo, name, engine_dir, decoupled=name != SYNC, work=work)
    supervisor = TritonSupervisor(
        TritonServerConfig(
            model_repository=repo, restart=False, startup_timeout_s=120, log_dir=work / "logs"
        )
    )
    supervisor.start()
    try:
        yield supervisor
    finally:
        supervisor.stop()


@pytest.fixture
async def client(triton):
    c = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        yield c
    finally:
        await c.close()


def make_inputs(prompt: list[int], output_len: int, **extra) -> list[InferInput]:
    """tensorrt_llm request tensors for one sequence (leading batch dim 1, as Triton expects)."""
    arrays: dict[str, np.ndarray] = {
        "input_ids": np.array([prompt], dtype=np.int32),
        "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
        "request_output_len": np.array([[output_len]], dtype=np.int32),
    }
    for name, value in extra.items():
        if isinstance(value, bool):
            arrays[name] = np.array([[value]], dtype=bool)
        elif isinstance(value, float):
            arrays[name] = np.array([[value]], dtype=np.float32)
        elif isinstance(value, np.ndarray):
            arrays[name] = value
        else:
            arrays[name] = np.array([[value]], dtype=np.int32)
    inputs = []
    for name, array in arrays.items():
        dtype = {
            np.dtype(bool): "BOOL",
            np.dtype(np.float32): "FP32",
            np.dtype(np.uint64): "UINT64",
        }.get(array.dtype, "INT32")
        tensor = InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def open_stream(client, model: str, inputs: list[InferInput], request_id: str = "", **options):
    """A gRPC stream carrying one request (`options`: more request fields), left to the caller
    to read and to cancel."""

    async def requests():
        yield {"model_name": model, "inputs": inputs, "request_id": request_id, **options}

    return client.stream_infer(requests())


async def stream(client, model: str, prompt, output_len, request_id: str = "", **extra):
    """Run one request on a gRPC stream; returns [(output_ids, result, is_final)] or raises."""
    responses = []
    iterator = open_stream(
        client,
        model,
        make_inputs(prompt, output_len, **extra),
        request_id,
        enable_empty_final_response=True,
    )
    try:
        async for result, error in iterator:
            if error is not None:
                raise error
            final = result.get_response().parameters["triton_final_response"].bool_param
            ids = result.as_numpy("output_ids")
            responses.append((None if ids is None else ids, result, final))
            if final:
                break
    finally:
        iterator.cancel()  # close the gRPC stream: an abandoned one keeps the model loaded
    return responses


def tokens_of(responses) -> list[int]:
    return [int(t) for ids, _, _ in responses if ids is not None for t in ids.reshape(-1)]


def metric(triton, name: str, model: str) -> float:
    text = urllib.request.urlopen(triton.metrics_url, timeout=5).read().decode()
    match = re.search(rf'^{name}{{model="{model}",version="1"}} ([0-9.e+]+)$', text, flags=re.M)
    assert match, f"{name} for {model} not on the metrics endpoint"
    return float(match.group(1))


PUBLISH_PERIODS_S = 0.3  # three of the engine's metric publications (every 0.1 s)


async def settled_metric(triton, name: str, model: str, timeout: float = 30.0) -> float:
    """`name` of `model` once earlier tests' counts have all reached the endpoint: the model
    shows nothing running or queued, and the value held over three publications."""

    def idle() -> bool:
        return all(
            metric(triton, gauge, model) == 0
            for gauge in ("trtllm_cpu_engine_active_requests", "trtllm_cpu_engine_queued_requests")
        )

    deadline = time.monotonic() + timeout
    previous = None
    while True:
        value = metric(triton, name, model) if idle() else None
        if value is not None and value == previous:
            return value
        assert time.monotonic() < deadline, f"{name} of {model} did not settle: {value}"
        previous = value
        await asyncio.sleep(PUBLISH_PERIODS_S)


async def cancelled_so_far(triton, model: str) -> float:
    return await settled_metric(triton, "trtllm_cpu_engine_cancelled_requests_total", model)


async def wait_metric(triton, name: str, model: str, predicate, timeout: float = 5.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        value = metric(triton, name, model)
        if predicate(value) or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.05)


async def assert_cancelled(triton, model: str, cancelled_before: float, count: int) -> None:
    """`count` more sequences of `model` were cancelled, and none is left generating."""
    cancelled = await wait_metric(
        triton,
        "trtllm_cpu_engine_cancelled_requests_total",
        model,
        lambda v: v >= cancelled_before + count,
    )
    assert cancelled == cancelled_before + count
    active = await wait_metric(triton, "trtllm_cpu_engine_active_requests", model, lambda v: v == 0)
    assert active == 0


PROMPT = [5, 6, 7, 8]
OUTPUTS = ("output_ids", "sequence_length")


async def test_streaming_synthetic_exact_tokens(client):
    responses = await stream(client, FAST, PROMPT, 6, streaming=True)
    expected = predict_tokens(PROMPT, 6, vocab_size=VOCAB, eos_token_id=EOS)
    assert tokens_of(responses) == expected  # only new tokens, never the prompt
    assert [final for _, _, final in responses] == [False] * 5 + [True]
    for ids, result, _ in responses:
        assert ids.shape == (1, 1, 1)
        assert result.as_numpy("sequence_length").tolist() == [[1]]
        assert result.as_numpy("batch_index").tolist() == [[0]]


async def test_non_streaming_includes_prompt_unless_excluded(client):
    expected = predict_tokens(PROMPT, 4, vocab_size=VOCAB, eos_token_id=EOS)
    with_prompt = await stream(
        client, FAST, PROMPT, 4, streaming=False, exclude_input_in_output=False
    )
    assert len(with_prompt) == 1 and with_prompt[0][2]
    ids, result, _ = with_prompt[0]
    assert ids.tolist() == [[PROMPT + expected]]
    assert result.as_numpy("sequence_length").tolist() == [[8]]
    without = await stream(
        client, FAST, PROMPT, 4, exclude_input_in_output=True, return_log_probs=True
    )
    ids, result, _ = without[0]
    assert ids.tolist() == [[expected]]
    assert result.as_numpy("output_log_probs").shape == (1, 1, 4)
    assert result.as_numpy("cum_log_probs").tolist() == [[0.0]]
    timed = await stream(client, FAST, PROMPT, 4, return_perf_metrics=True)
    _, result, _ = timed[0]
    times = [
        int(result.as_numpy(name)[0, 0])
        for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns")
    ]
    assert 0 < times[0] <= times[1] <= times[2] <= int(result.as_numpy("last_token_time_ns")[0, 0])


async def test_stream_interval_parameter_groups_tokens(client):
    responses = await stream(client, INTERVAL, PROMPT, 10, streaming=True)
    assert [ids.shape[-1] for ids, _, _ in responses] == [1, 4, 4, 1]
    assert tokens_of(responses) == predict_tokens(PROMPT, 10, vocab_size=VOCAB, eos_token_id=EOS)


async def test_top_log_probs_come_with_each_token(client):
    expected = predict_tokens(PROMPT, 3, vocab_size=VOCAB, eos_token_id=EOS)
    streamed = await stream(
        client, FAST, PROMPT, 3, streaming=True, return_log_probs=True, top_log_probs=2
    )
    for token, (_, result, _) in zip(expected, streamed, strict=True):
        assert result.as_numpy("output_top_token_ids")[0, 0].tolist() == [[token, token + 1]]
        assert result.as_numpy("output_top_log_probs")[0, 0].tolist() == [[0.0, float("-inf")]]
    (whole,) = await stream(client, FAST, PROMPT, 3, top_log_probs=2, return_log_probs=True)
    assert whole[1].as_numpy("output_top_token_ids")[0, 0, :, 0].tolist() == expected
    with pytest.raises(InferenceServerException, match="top_log_probs must be 0 to 20"):
        await stream(client, FAST, PROMPT, 3, top_log_probs=21)


async def test_end_id_and_stop_words(client):
    expected = predict_tokens(PROMPT, 6, vocab_size=VOCAB, eos_token_id=EOS)
    ended = await stream(client, FAST, PROMPT, 6, streaming=True, end_id=expected[2])
    assert tokens_of(ended) == expected[:2]
    assert ended[-1][2] and ended[-1][0].shape == (1, 1, 0)
    stop_words = np.array([[[expected[1], expected[2]], [2, -1]]], dtype=np.int32)
    stopped = await stream(
        client, FAST, PROMPT, 6, exclude_input_in_output=True, stop_words_list=stop_words
    )
    assert tokens_of(stopped) == expected[:3]


async def test_64_concurrent_streams_get_exact_counts(client, triton):
    before = await settled_metric(triton, "trtllm_cpu_engine_generated_tokens_total", FAST)
    counts = [20 + (i % 7) for i in range(64)]
    results = await asyncio.gather(
        *[
            stream(client, FAST, [i + 3, 9], counts[i], request_id=f"c{i}", streaming=True)
            for i in range(64)
        ]
    )
    for i, responses in enumerate(results):
        assert tokens_of(responses) == predict_tokens(
            [i + 3, 9], counts[i], vocab_size=VOCAB, eos_token_id=EOS
        )
    after = await wait_metric(
        triton,
        "trtllm_cpu_engine_generated_tokens_total",
        FAST,
        lambda v: v >= before + sum(counts),
    )
    assert after == before + sum(counts)


async def test_cancelled_stream_frees_its_slot(client, triton):
    cancelled_before = await cancelled_so_far(triton, SLOW)
    iterator = open_stream(client, SLOW, make_inputs(PROMPT, 1000, streaming=True), "long")
    received = 0
    async for _result, error in iterator:
        assert error is None
        received += 1
        if received == 3:
            break
    # The only batch slot is taken: a second request waits in the queue.
    waiting = asyncio.create_task(stream(client, SLOW, PROMPT, 3, streaming=True))
    queued = await wait_metric(triton, "trtllm_cpu_engine_queued_requests", SLOW, lambda v: v == 1)
    assert queued == 1
    iterator.cancel()
    responses = await asyncio.wait_for(waiting, 10)
    assert len(tokens_of(responses)) == 3
    await assert_cancelled(triton, SLOW, cancelled_before, 1)


async def test_stop_input_cancels_request_with_same_id(client, triton):
    long_task = asyncio.create_task(
        stream(client, SLOW, PROMPT, 1000, request_id="to-stop", streaming=True)
    )
    await wait_metric(triton, "trtllm_cpu_engine_active_requests", SLOW, lambda v: v == 1)
    await stream(client, SLOW, PROMPT, 1, request_id="to-stop", stop=True)
    responses = await asyncio.wait_for(long_task, 10)
    assert responses[-1][2]
    assert 0 < len(tokens_of(responses)) < 1000


async def test_errors_are_per_request(client):
    with pytest.raises(InferenceServerException, match="max_input_len"):
        await stream(client, FAST, list(range(3, 3 + 65)), 4, streaming=True)
    with pytest.raises(InferenceServerException, match="max_seq_len"):
        await stream(client, FAST, PROMPT, 3000)
    with pytest.raises(InferenceServerException, match="beam_width"):
        await stream(client, FAST, PROMPT, 3, beam_width=4)
    with pytest.raises(InferenceServerException, match="vocabulary"):
        await stream(client, FAST, [VOCAB + 1], 3)
    # The model is still serving.
    responses = await stream(client, FAST, PROMPT, 2, streaming=True)
    assert len(tokens_of(responses)) == 2


async def test_non_decoupled_model_blocks_and_returns(client):
    result = await client.infer(
        SYNC,
        make_inputs(PROMPT, 5, exclude_input_in_output=True),
        outputs=[InferRequestedOutput("output_ids"), InferRequestedOutput("sequence_length")],
    )
    expected = predict_tokens(PROMPT, 5, vocab_size=VOCAB, eos_token_id=EOS)
    assert result.as_numpy("output_ids").tolist() == [[expected]]
    with pytest.raises(InferenceServerException, match="decoupled"):
        await client.infer(SYNC, make_inputs(PROMPT, 5, streaming=True))


async def test_hf_streaming_matches_non_streaming_and_transformers(client, engine_dirs):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = engine_dirs[HF] / "checkpoint"
    tokenizer = AutoTokenizer.from_pretrained(str(ckpt), local_files_only=True)
    prompt = tokenizer("The lighthouse keeper")["input_ids"]
    # end_id + min_tokens ban EOS as min_new_tokens does in the transformers reference.
    same = {"end_id": EOS, "min_tokens": 8}
    streamed = await stream(client, HF, prompt, 8, streaming=True, return_log_probs=True, **same)
    whole = await stream(client, HF, prompt, 8, exclude_input_in_output=True, **same)
    assert tokens_of(streamed) == tokens_of(whole)
    assert len(tokens_of(whole)) == 8
    assert all(r.as_numpy("output_log_probs")[0, 0, 0] < 0 for _, r, _ in streamed)
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), local_files_only=True).eval()
    reference = model.generate(
        torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0
    )[0, len(prompt) :].tolist()
    assert tokens_of(whole) == reference
    sampled = [
        tokens_of(
            await stream(
                client,
                HF,
                prompt,
                8,
                exclude_input_in_output=True,
                temperature=1.5,
                runtime_top_k=40,
                seed=np.array([[seed]], dtype=np.uint64),
            )
        )
        for seed in (3, 3)
    ]
    assert sampled[0] == sampled[1]


def batch_inputs(prompts: list[list[int]], output_lens: list[int], **flags: bool):
    """A request carrying several sequences (as the ensemble sends for a batch of prompts)."""
    width = max(len(p) for p in prompts)
    arrays = {
        "input_ids": np.array([p + [0] * (width - len(p)) for p in prompts], dtype=np.int32),
        "input_lengths": np.array([[len(p)] for p in prompts], dtype=np.int32),
        "request_output_len": np.array([[n] for n in output_lens], dtype=np.int32),
    }
    for name, value in flags.items():
        arrays[name] = np.array([[value]] * len(prompts), dtype=bool)
    inputs = []
    for name, array in arrays.items():
        tensor = InferInput(name, list(array.shape), "BOOL" if array.dtype == bool else "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


async def test_batched_request_streams_rows_with_batch_index(client):
    prompts, lens = [[5, 6, 7], [9, 10]], [4, 2]
    inputs = batch_inputs(prompts, lens, streaming=True)
    per_row: dict[int, list[int]] = {0: [], 1: []}
    finals = 0
    iterator = open_stream(client, FAST, inputs, enable_empty_final_response=True)
    try:
        async for result, error in iterator:
            assert error is None
            finals += result.get_response().parameters["triton_final_response"].bool_param
            ids = result.as_numpy("output_ids")
            if ids is not None:
                per_row[int(result.as_numpy("batch_index")[0, 0])].extend(ids.reshape(-1).tolist())
            if finals:
                break
    finally:
        iterator.cancel()
    for row, prompt in enumerate(prompts):
        assert per_row[row] == predict_tokens(prompt, lens[row], vocab_size=VOCAB, eos_token_id=EOS)


async def test_batched_request_non_decoupled_is_merged_and_padded(client):
    prompts, lens = [[5, 6, 7], [9, 10]], [4, 2]
    result = await client.infer(SYNC, batch_inputs(prompts, lens, exclude_input_in_output=True))
    expected = [
        predict_tokens(p, n, vocab_size=VOCAB, eos_token_id=EOS)
        for p, n in zip(prompts, lens, strict=True)
    ]
    ids = result.as_numpy("output_ids")
    assert ids.shape == (2, 1, 4)
    assert result.as_numpy("sequence_length").tolist() == [[4], [2]]
    assert ids[0, 0].tolist() == expected[0]
    assert ids[1, 0, :2].tolist() == expected[1]
    assert result.as_numpy("batch_index").tolist() == [[0], [1]]


# ----- num_return_sequences -------------------------------------------------------------------


def by_sequence(responses) -> dict[int, list[int]]:
    """Tokens per sequence_index (every data response must carry batch_index 0)."""
    out: dict[int, list[int]] = {}
    for ids, result, _ in responses:
        if ids is None:
            continue
        assert result.as_numpy("batch_index").tolist() == [[0]]
        index = int(result.as_numpy("sequence_index")[0, 0])
        out.setdefault(index, []).extend(int(t) for t in ids.reshape(-1))
    return out


def seeded(prompt: list[int], n: int, seed: int) -> list[int]:
    return predict_tokens(prompt, n, vocab_size=VOCAB, eos_token_id=EOS, seed=seed)


async def test_return_sequences_streaming(client):
    """Three sequences stream interleaved, each complete with seed + index; one FINAL at the end."""
    seed = np.array([[10]], dtype=np.uint64)
    responses = await stream(
        client, FAST, PROMPT, 6, streaming=True, num_return_sequences=3, seed=seed
    )
    assert by_sequence(responses) == {i: seeded(PROMPT, 6, 10 + i) for i in range(3)}
    assert len(responses) == 18  # one token per response; the FINAL rides the last one
    assert [final for _, _, final in responses] == [False] * 17 + [True]
    for ids, result, _ in responses:
        assert ids.shape == (1, 1, 1)
        assert result.as_numpy("sequence_length").tolist() == [[1]]


async def test_return_sequences_non_streaming_decoupled(client):
    """Not streaming on the decoupled model: one whole response per sequence, then FINAL."""
    responses = await stream(
        client,
        FAST,
        PROMPT,
        5,
        num_return_sequences=3,
        exclude_input_in_output=True,
        return_log_probs=True,
    )
    assert len(responses) == 3
    assert [final for _, _, final in responses] == [False, False, True]
    assert by_sequence(responses) == {i: seeded(PROMPT, 5, i) for i in range(3)}
    for ids, result, _ in responses:
        assert ids.shape == (1, 1, 5)
        assert result.as_numpy("sequence_length").tolist() == [[5]]
        assert result.as_numpy("output_log_probs").shape == (1, 1, 5)
    # With the prompt: each sequence's whole output starts with it.
    with_prompt = await stream(
        client, FAST, PROMPT, 3, num_return_sequences=2, exclude_input_in_output=False
    )
    assert {
        int(r.as_numpy("sequence_index")[0, 0]): ids.reshape(-1).tolist()
        for ids, r, _ in with_prompt
    } == {i: PROMPT + seeded(PROMPT, 3, i) for i in range(2)}


async def test_return_sequences_rows_times_n(client):
    """Two rows x two sequences: four streams told apart by (batch_index, sequence_index)."""
    prompts, lens = [[5, 6, 7], [9, 10]], [4, 3]
    inputs = batch_inputs(prompts, lens, streaming=True)
    count = InferInput("num_return_sequences", [2, 1], "INT32")
    count.set_data_from_numpy(np.array([[2], [2]], dtype=np.int32))
    got: dict[tuple[int, int], list[int]] = {}
    finals = []
    iterator = open_stream(client, FAST, [*inputs, count], enable_empty_final_response=True)
    try:
        async for result, error in iterator:
            assert error is None
            final = result.get_response().parameters["triton_final_response"].bool_param
            finals.append(final)
            key = (
                int(result.as_numpy("batch_index")[0, 0]),
                int(result.as_numpy("sequence_index")[0, 0]),
            )
            got.setdefault(key, []).extend(result.as_numpy("output_ids").reshape(-1).tolist())
            if final:
                break
    finally:
        iterator.cancel()
    assert got == {
        (row, i): seeded(prompts[row], lens[row], i) for row in range(2) for i in range(2)
    }
    assert finals == [False] * (sum(lens) * 2 - 1) + [True]


async def test_return_sequences_errors(client):
    with pytest.raises(
        InferenceServerException,
        match="num_return_sequences 5 exceeds the engine's max_batch_size 4",
    ):
        await stream(client, MULTI, PROMPT, 3, streaming=True, num_return_sequences=5)
    with pytest.raises(InferenceServerException, match="num_return_sequences must be at least 1"):
        await stream(client, FAST, PROMPT, 3, num_return_sequences=0)
    with pytest.raises(InferenceServerException, match="beam_width"):
        await stream(client, FAST, PROMPT, 3, beam_width=2, num_return_sequences=2)
    with pytest.raises(
        InferenceServerException,
        match=re.escape("num_return_sequences > 1 needs the decoupled (streaming) transaction"),
    ):
        await client.infer(SYNC, make_inputs(PROMPT, 3, num_return_sequences=2))
    # num_return_sequences 1 is still fine on the non-decoupled model.
    result = await client.infer(
        SYNC, make_inputs(PROMPT, 3, num_return_sequences=1, exclude_input_in_output=True)
    )
    assert result.as_numpy("output_ids").tolist() == [[seeded(PROMPT, 3, 0)]]
    # Exactly max_batch_size sequences is allowed.
    responses = await stream(client, MULTI, PROMPT, 2, num_return_sequences=4)
    assert sorted(by_sequence(responses)) == [0, 1, 2, 3]


async def test_return_sequences_stop_cancels_all(client, triton):
    cancelled_before = await cancelled_so_far(triton, MULTI)
    long_task = asyncio.create_task(
        stream(
            client,
            MULTI,
            PROMPT,
            1000,
            request_id="stop-multi",
            streaming=True,
            num_return_sequences=3,
        )
    )
    await wait_metric(triton, "trtllm_cpu_engine_active_requests", MULTI, lambda v: v == 3)
    await stream(client, MULTI, PROMPT, 1, request_id="stop-multi", stop=True)
    responses = await asyncio.wait_for(long_task, 10)
    assert [final for _, _, final in responses].count(True) == 1 and responses[-1][2]
    tokens = by_sequence(responses)
    assert sorted(tokens) == [0, 1, 2]
    assert all(0 < len(t) < 1000 for t in tokens.values())
    await assert_cancelled(triton, MULTI, cancelled_before, 3)


async def test_return_sequences_client_cancel_drops_all(client, triton):
    cancelled_before = await cancelled_so_far(triton, MULTI)
    inputs = make_inputs(PROMPT, 1000, streaming=True, num_return_sequences=3)
    iterator = open_stream(client, MULTI, inputs, "gone-multi")
    seen: set[int] = set()
    async for result, error in iterator:
        assert error is None
        seen.add(int(result.as_numpy("sequence_index")[0, 0]))
        if len(seen) == 3:
            break
    iterator.cancel()
    await assert_cancelled(triton, MULTI, cancelled_before, 3)


def test_a_ready_servers_repository_index_names_no_model_waiting(triton) -> None:
    # What a slow start's report reads: the index is Triton's own, in the shape it really has.
    assert models_not_ready(triton.ports, 10, triton.control.http_headers) == []
    assert models_not_ready(triton.ports, 10) is None  # a restricted API: not without the secret


def test_stub_that_outlives_tritonserver_is_killed(engine_dirs, tmp_path):
    """A stub stuck when tritonserver dies (simulated with SIGSTOP) is SIGKILLed by the guard."""
    from tensorrtllm_backend.triton.command import find_free_port
    from tensorrtllm_backend.triton.install import find_tritonserver

    repo = tmp_path / "repo"
    repo.mkdir()
    _add_model(repo, FAST, engine_dirs[FAST], decoupled=True, work=tmp_path)
    installation = find_tritonserver()
    env = dict(
        os.environ,
        TRTLLM_CPU_ENGINE_ORPHAN_GRACE_S="1",
        TRTLLM_BACKEND_PYTHONPATH=os.pathsep.join(
            [str(Path(np.__file__).parents[1]), str(Path(__file__).parents[2])]
        ),
        LD_LIBRARY_PATH=os.pathsep.join(str(p) for p in installation.library_dirs),
    )
    http_port = find_free_port()
    server = subprocess.Popen(
        [
            str(installation.binary),
            f"--model-repository={repo}",
            f"--backend-directory={installation.backend_dir}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={find_free_port()}",
            "--http-address=127.0.0.1",
            f"--http-port={http_port}",
            "--allow-metrics=false",
            "--exit-timeout-secs=3",
        ],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stub = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready") as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
        assert len(children) == 1
        stub = int(children[0])
        os.kill(stub, signal.SIGSTOP)  # a stub deadlocked in an IPC call looks like this
        server.kill()
        server.wait()
        deadline = time.monotonic() + 15
        while Path(f"/proc/{stub}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{stub}").exists(), "orphaned stub still alive"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        if stub is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stub, signal.SIGKILL)
        server.wait()


def test_a_graceful_stop_leaves_no_core_dump(engine_dirs, tmp_path, monkeypatch) -> None:
    """The engine's Triton metric objects used to outlive finalize(); destroyed at the stub's
    exit, after its shared memory, they segfaulted it at every shutdown, leaving a ~300 MB core
    file in the working directory wherever core dumps are on."""
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|") or "/" in pattern:
        pytest.skip(f"core dumps do not go to the working directory here ({pattern!r})")
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    if hard != resource.RLIM_INFINITY and hard < 2**30:
        pytest.skip(f"core dumps are limited to {hard} bytes here")
    repo = tmp_path / "repo"
    repo.mkdir()
    _add_model(repo, FAST, engine_dirs[FAST], decoupled=True, work=tmp_path)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # tritonserver and its stubs inherit it, and the core limit below
    supervisor = TritonSupervisor(
        TritonServerConfig(
            model_repository=repo, restart=False, startup_timeout_s=120, log_dir=tmp_path / "logs"
        )
    )
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    try:
        supervisor.start()
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))
    supervisor.stop()
    assert not list(cwd.glob("core*"))


# --- the service's own client: one unary-stream ModelStreamInfer call per request ----------------
def client_tensors(prompt: list[int], output_len: int) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.array([prompt], dtype=np.int32),
        "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
        "request_output_len": np.array([[output_len]], dtype=np.int32),
        "streaming": np.array([[True]], dtype=bool),
    }


async def client_tokens(responses) -> list[int]:
    tokens = []
    async for result in responses:
        tokens.extend(result.values("output_ids") or [])
    return tokens


async def test_service_client_streams_every_token_in_order(triton) -> None:
    client = TritonLLMClient(triton.grpc_url)
    try:
        responses = client.stream(FAST, client_tensors(PROMPT, 40), OUTPUTS, "svc-order")
        tokens = await client_tokens(responses)
    finally:
        await client.close()
    assert tokens == predict_tokens(PROMPT, 40, vocab_size=VOCAB, eos_token_id=EOS)
    assert client.open_streams == 0 and client.responses_received >= 40


async def test_service_client_reports_a_model_error(triton) -> None:
    client = TritonLLMClient(triton.grpc_url)
    try:
        too_long = client_tensors(list(range(3, 3 + 65)), 4)  # FAST's max_input_len is 64
        with pytest.raises(EngineModelError, match="max_input_len"):
            await client_tokens(client.stream(FAST, too_long, OUTPUTS, "svc-error"))
        with pytest.raises(EngineModelError, match="unknown model"):
            await client_tokens(client.stream("nope", client_tensors(PROMPT, 2), OUTPUTS, "x"))
    finally:
        await client.close()


async def test_service_client_leaving_early_cancels_the_engine_request(triton) -> None:
    await wait_metric(triton, "trtllm_cpu_engine_active_requests", SLOW, lambda v: v == 0)
    cancelled_before = metric(triton, "trtllm_cpu_engine_cancelled_requests_total", SLOW)
    client = TritonLLMClient(triton.grpc_url)
    try:
        responses = client.stream(SLOW, client_tensors(PROMPT, 1000), OUTPUTS, "svc-leave")
        received = 0
        async for _ in responses:
            received += 1
            if received == 3:
                break
        await responses.aclose()
        assert client.open_streams == 0
        await assert_cancelled(triton, SLOW, cancelled_before, 1)
    finally:
        await client.close()


async def test_service_client_without_a_server_is_unavailable() -> None:
    client = TritonLLMClient("127.0.0.1:1")
    try:
        with pytest.raises(EngineUnavailableError):
            await client_tokens(client.stream(FAST, client_tensors(PROMPT, 2), OUTPUTS, "x"))
    finally:
        await client.close()
