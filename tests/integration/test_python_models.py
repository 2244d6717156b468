"""The preprocessing / postprocessing / tensorrt_llm_bls models and the ensemble on a real
tritonserver with the CPU engine (synthetic mode: predictable tokens; hf mode: the demo Llama).

The synthetic engine's tokens are predictable (cpu_engine.synthetic.predict_tokens), so texts are
checked against the tokenizer's own decoding of exactly those tokens. Its pseudo-random ids hit
byte tokens of multi-byte characters all the time, which is what breaks stateless streaming.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tritonclient.grpc.aio as grpcclient

from tensorrtllm_backend.common.cpu_engine_config import write_engine_dir
from tensorrtllm_backend.common.tokenization import decode
from tensorrtllm_backend.packing.repository import fill_repository
from tensorrtllm_backend.python_models.cpu_engine.synthetic import predict_tokens
from tensorrtllm_backend.triton.command import TritonServerConfig
from tensorrtllm_backend.triton.supervisor import TritonSupervisor
from tests.waiting import wait_for_async

pytestmark = pytest.mark.integration

EOS_ID = 2
PROMPTS = [
    "The lighthouse keeper woke before dawn.",
    "Le café était presque vide. Grüße aus München!",
    "Şehrin eski sokaklarında 日本語 🙂",
    "A",
]
ENSEMBLE = "ensemble"
BLS = "tensorrt_llm_bls"
BLS_ACCUMULATE = "tensorrt_llm_bls_accumulate"


@dataclass
class Server:
    supervisor: TritonSupervisor
    root: Path

    @property
    def url(self) -> str:
        return self.supervisor.grpc_url

    def metric(self, name: str) -> float:
        """Sum of one metric family (CPU engine gauges/counters) from Triton's metrics port."""
        text = urllib.request.urlopen(self.supervisor.metrics_url, timeout=5).read().decode()
        values = [float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
        return sum(values)


def _add_accumulating_bls(repo: Path) -> None:
    """A second BLS model with accumulate_tokens=true next to the default one."""
    src = repo / BLS
    dst = repo / BLS_ACCUMULATE
    shutil.copytree(src, dst)
    config = (dst / "config.pbtxt").read_text()
    config = re.sub(r'name:\s*"tensorrt_llm_bls"', f'name: "{BLS_ACCUMULATE}"', config, count=1)
    config = re.sub(
        r'(key:\s*"accumulate_tokens"\s*value\s*:?\s*\{\s*string_value:\s*)"[^"]*"',
        r'\1"true"',
        config,
    )
    assert f'name: "{BLS_ACCUMULATE}"' in config and '"true"' in config
    (dst / "config.pbtxt").write_text(config)


def _start(root: Path, checkpoint: Path, vocab_size: int, **engine: object) -> Iterator[Server]:
    """The filled templates over a CPU engine written with `engine` (its mode and settings),
    in a model root of their own that links the checkpoint in."""
    (root / "checkpoint").symlink_to(checkpoint)
    engine_dir = write_engine_dir(
        root / "engine", vocab_size=vocab_size, eos_token_id=EOS_ID, **engine
    )
    # tokenizer_dir stays relative (as in the model store): the models resolve it against the
    # model root, the parent of the repository directory.
    repo = fill_repository(
        root / "repo",
        {
            "triton_backend": "python",
            "engine_dir": str(engine_dir),
            "tokenizer_dir": "checkpoint",
            "decoupled_mode": "true",
            "triton_max_batch_size": "8",
        },
    )
    _add_accumulating_bls(repo)
    supervisor = TritonSupervisor(
        TritonServerConfig(
            model_repository=repo, restart=False, startup_timeout_s=180, log_dir=root / "logs"
        )
    )
    try:
        supervisor.start()
        yield Server(supervisor, root)
    finally:
        supervisor.stop()


@pytest.fixture(scope="module")
def synthetic_server(
    tmp_path_factory: pytest.TempPathFactory, demo_checkpoint: Path, demo_tokenizer
):
    root = tmp_path_factory.mktemp("synthetic")
    yield from _start(root, demo_checkpoint, len(demo_tokenizer), mode="synthetic", itl_ms=2.0)


@pytest.fixture(scope="module")
def hf_server(tmp_path_factory: pytest.TempPathFactory, demo_checkpoint: Path, demo_tokenizer):
    root = tmp_path_factory.mktemp("hf")
    yield from _start(
        root, demo_checkpoint, len(demo_tokenizer), mode="hf", checkpoint_dir=demo_checkpoint
    )


# ----- client helpers ------------------------------------------------------------------------


@dataclass
class Generation:
    chunks: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.chunks)


def _inputs(prompt: str, max_tokens: int, stream: bool, **extra) -> list[grpcclient.InferInput]:
    def tensor(name: str, value: np.ndarray, dtype: str) -> grpcclient.InferInput:
        item = grpcclient.InferInput(name, list(value.shape), dtype)
        item.set_data_from_numpy(value)
        return item

    inputs = [
        tensor("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES"),
        tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
        tensor("stream", np.array([[stream]]), "BOOL"),
    ]
    if "stop_words" in extra:
        words = np.array([[w.encode() for w in extra.pop("stop_words")]], dtype=object)
        inputs.append(tensor("stop_words", words, "BYTES"))
    if "exclude_input_in_output" in extra:
        value = np.array([[extra.pop("exclude_input_in_output")]])
        inputs.append(tensor("exclude_input_in_output", value, "BOOL"))
    if "num_return_sequences" in extra:
        value = np.array([[extra.pop("num_return_sequences")]], dtype=np.int32)
        inputs.append(tensor("num_return_sequences", value, "INT32"))
    assert not extra, f"unknown inputs {extra}"
    return inputs


def _stream_call(client, model: str, prompt: str, max_tokens: int, stream: bool, **extra):
    async def requests() -> AsyncIterator[dict]:
        yield {
            "model_name": model,
            "inputs": _inputs(prompt, max_tokens, stream, **extra),
            "outputs": [grpcclient.InferRequestedOutput("text_output")],
            "request_id": uuid.uuid4().hex,
            "enable_empty_final_response": True,
        }

    return client.stream_infer(requests())


async def generate(
    url: str, model: str, prompt: str, max_tokens: int, *, stream: bool, **extra
) -> Generation:
    """One request over the gRPC stream API (decoupled models need it even without streaming)."""
    result = Generation()
    async with grpcclient.InferenceServerClient(url) as client:
        async for response, error in _stream_call(
            client, model, prompt, max_tokens, stream, **extra
        ):
            if error is not None:
                result.error = str(error)
                break
            text = response.as_numpy("text_output")
            if text is not None:
                result.chunks.append(text.reshape(-1)[0].decode("utf-8"))
            params = response.get_response().parameters
            if params["triton_final_response"].bool_param:
                break
    return result


def expected_text(
    tokenizer, prompt: str, max_tokens: int, *, with_prompt: bool = False, seed: int = 0
) -> str:
    """What the synthetic engine generates, decoded as every path must (no partial last char)."""
    prompt_ids = tokenizer.encode(prompt)
    ids = predict_tokens(
        prompt_ids, max_tokens, vocab_size=len(tokenizer), eos_token_id=EOS_ID, seed=seed
    )
    if with_prompt:
        ids = prompt_ids + ids
    return decode(tokenizer, ids).rstrip("\ufffd")


# ----- ensemble and BLS on the synthetic engine ------------------------------------------------


@pytest.mark.parametrize("model", [ENSEMBLE, BLS])
async def test_streaming_concatenation_equals_non_streaming(
    synthetic_server: Server, demo_tokenizer, model: str
) -> None:
    url = synthetic_server.url
    stateless_breaks = 0
    for prompt in PROMPTS:
        whole = await generate(url, model, prompt, 48, stream=False)
        streamed = await generate(url, model, prompt, 48, stream=True)
        assert whole.error is None and streamed.error is None, (whole.error, streamed.error)
        assert whole.text == expected_text(demo_tokenizer, prompt, 48)
        assert streamed.text == whole.text
        assert all("\ufffd" not in chunk or "\ufffd" in whole.text for chunk in streamed.chunks)
        ids = predict_tokens(
            demo_tokenizer.encode(prompt), 48, vocab_size=len(demo_tokenizer), eos_token_id=2
        )
        stateless = "".join(decode(demo_tokenizer, [i]) for i in ids)
        stateless_breaks += stateless != decode(demo_tokenizer, ids)
    # The check means something: per-token decoding would have garbled some of these outputs.
    assert stateless_breaks > 0


async def test_ensemble_multibyte_prompt_echo_streams_intact(
    synthetic_server: Server, demo_tokenizer
) -> None:
    """exclude_input_in_output=false: the non-streamed text starts with the multi-byte prompt."""
    prompt = "Şehrin eski sokaklarında 日本語 🙂"
    for model in (ENSEMBLE, BLS):
        with_prompt = await generate(
            synthetic_server.url, model, prompt, 8, stream=False, exclude_input_in_output=False
        )
        without = await generate(
            synthetic_server.url, model, prompt, 8, stream=False, exclude_input_in_output=True
        )
        assert with_prompt.text == expected_text(demo_tokenizer, prompt, 8, with_prompt=True)
        assert with_prompt.text.startswith(prompt)
        assert without.text == expected_text(demo_tokenizer, prompt, 8)
        assert not without.text.startswith(prompt)


@pytest.mark.parametrize("model", [ENSEMBLE, BLS])
async def test_max_tokens_exact(synthetic_server: Server, demo_tokenizer, model: str) -> None:
    prompt = PROMPTS[0]
    for max_tokens in (1, 5, 17):
        streamed = await generate(synthetic_server.url, model, prompt, max_tokens, stream=True)
        assert streamed.error is None
        assert streamed.text == expected_text(demo_tokenizer, prompt, max_tokens)
        if model == ENSEMBLE:  # one response per generated token (the empty final has no text)
            assert len(streamed.chunks) == max_tokens


def _stop_word(tokenizer, prompt: str, max_tokens: int) -> tuple[str, int]:
    """A single-token word from the middle of the synthetic output that re-encodes to itself."""
    ids = predict_tokens(
        tokenizer.encode(prompt), max_tokens, vocab_size=len(tokenizer), eos_token_id=2
    )
    for position in range(8, max_tokens):
        word = decode(tokenizer, [ids[position]])
        if (
            len(word.strip()) >= 2
            and "\ufffd" not in word
            and tokenizer.encode(word, add_special_tokens=False) == [ids[position]]
            and ids.index(ids[position]) == position
            and word not in decode(tokenizer, ids[:position])
        ):
            return word, position
    raise AssertionError("no usable stop word in the synthetic output")


@pytest.mark.parametrize("stream", [True, False])
async def test_stop_word_ends_generation(
    synthetic_server: Server, demo_tokenizer, stream: bool
) -> None:
    prompt, max_tokens = PROMPTS[1], 64
    word, position = _stop_word(demo_tokenizer, prompt, max_tokens)
    full = expected_text(demo_tokenizer, prompt, max_tokens)
    # BLS: cut on the text, the stop string itself is not returned.
    bls = await generate(
        synthetic_server.url, BLS, prompt, max_tokens, stream=stream, stop_words=[word]
    )
    assert bls.error is None
    assert bls.text == full[: full.index(word)]
    assert word not in bls.text
    # Ensemble: the engine stops on the word's tokens and, as TensorRT-LLM, returns them.
    ens = await generate(
        synthetic_server.url, ENSEMBLE, prompt, max_tokens, stream=stream, stop_words=[word]
    )
    assert ens.error is None
    assert ens.text == expected_text(demo_tokenizer, prompt, position + 1)
    assert ens.text.endswith(word)


def _text_only_stop(tokenizer, full: str, ids: list[int]) -> str:
    """A 3-character stop string whose tokens never occur in the output: only text matching
    (the BLS) can see it, the engine's token-level stop words cannot."""
    for start in range(len(full) // 3, len(full) - 3):
        candidate = full[start : start + 3]
        encoded = tokenizer.encode(candidate, add_special_tokens=False)
        in_ids = any(ids[i : i + len(encoded)] == encoded for i in range(len(ids)))
        if "\ufffd" not in candidate and full.index(candidate) == start and not in_ids:
            return candidate
    raise AssertionError("no text-only stop string in the synthetic output")


async def test_bls_stop_string_cancels_engine_request(
    synthetic_server: Server, demo_tokenizer
) -> None:
    """A text-level stop ends the inner request at once (stop=true), not after max_tokens."""
    prompt, max_tokens = PROMPTS[1], 64
    word, _ = _stop_word(demo_tokenizer, prompt, max_tokens)
    before = synthetic_server.metric("trtllm_cpu_engine_cancelled_requests_total")
    long_max = 1000
    full = expected_text(demo_tokenizer, prompt, max_tokens)
    ids = predict_tokens(
        demo_tokenizer.encode(prompt), max_tokens, vocab_size=len(demo_tokenizer), eos_token_id=2
    )
    stop_text = _text_only_stop(demo_tokenizer, full, ids)
    result = await generate(
        synthetic_server.url, BLS, prompt, long_max, stream=True, stop_words=[stop_text]
    )
    assert result.error is None
    assert result.text == full[: full.index(stop_text)]
    assert await wait_for_async(
        lambda: synthetic_server.metric("trtllm_cpu_engine_cancelled_requests_total") > before, 10
    )
    assert await wait_for_async(
        lambda: synthetic_server.metric("trtllm_cpu_engine_active_requests") == 0, 10
    )


async def test_bls_client_cancellation_cancels_engine_request(synthetic_server: Server) -> None:
    before = synthetic_server.metric("trtllm_cpu_engine_cancelled_requests_total")
    async with grpcclient.InferenceServerClient(synthetic_server.url) as client:
        call = _stream_call(client, BLS, PROMPTS[0], 1000, True)
        received = 0
        async for _response, error in call:
            assert error is None
            received += 1
            if received == 3:
                call.cancel()
                break
    assert await wait_for_async(
        lambda: synthetic_server.metric("trtllm_cpu_engine_cancelled_requests_total") > before, 10
    )
    assert await wait_for_async(
        lambda: synthetic_server.metric("trtllm_cpu_engine_active_requests") == 0, 10
    )


async def test_bls_accumulate_tokens(synthetic_server: Server, demo_tokenizer) -> None:
    """accumulate_tokens=true: every streamed response carries the whole text so far."""
    prompt = PROMPTS[2]
    expected = expected_text(demo_tokenizer, prompt, 24)
    streamed = await generate(synthetic_server.url, BLS_ACCUMULATE, prompt, 24, stream=True)
    assert streamed.error is None
    assert len(streamed.chunks) > 3
    assert streamed.chunks[-1] == expected
    for shorter, longer in zip(streamed.chunks, streamed.chunks[1:], strict=False):
        assert longer.startswith(shorter) and len(longer) > len(shorter)
    # The default BLS streams deltas that add up to the same text.
    deltas = await generate(synthetic_server.url, BLS, prompt, 24, stream=True)
    assert deltas.text == expected and len(deltas.chunks) == len(streamed.chunks)


async def test_empty_prompt_is_an_error(synthetic_server: Server) -> None:
    for model in (ENSEMBLE, BLS):
        result = await generate(synthetic_server.url, model, "", 4, stream=True)
        assert result.error is not None and "prompt is empty" in result.error


# ----- num_return_sequences through the BLS and the ensemble ------------------------------------


@dataclass
class Sequences:
    texts: dict[int, str] = field(default_factory=dict)  # text per sequence_index
    responses: int = 0
    error: str | None = None


async def generate_sequences(
    url: str, model: str, prompt: str, max_tokens: int, count: int, *, stream: bool, **call
) -> Sequences:
    """One request with num_return_sequences = count; texts joined per sequence_index.

    Reads until the server closes the stream, which it does once the FINAL flag was sent (the
    aio client cannot ask for empty final responses, so a flag-only FINAL is not seen): a
    missing FINAL shows up as a timeout, a response after it is impossible.
    """
    result = Sequences()

    async def requests() -> AsyncIterator[dict]:
        yield {
            "model_name": model,
            "inputs": _inputs(prompt, max_tokens, stream, num_return_sequences=count),
            "outputs": [
                grpcclient.InferRequestedOutput("text_output"),
                grpcclient.InferRequestedOutput("sequence_index"),
            ],
            **call,
        }

    async def read(client) -> None:
        async for response, error in client.stream_infer(requests()):
            if error is not None:
                result.error = str(error)
                break
            result.responses += 1
            text = response.as_numpy("text_output")
            if text is not None:
                index = int(response.as_numpy("sequence_index").reshape(-1)[0])
                chunk = text.reshape(-1)[0].decode("utf-8")
                result.texts[index] = result.texts.get(index, "") + chunk

    async with grpcclient.InferenceServerClient(url) as client:
        await asyncio.wait_for(read(client), 60)
    return result


@pytest.mark.parametrize("stream", [True, False])
async def test_bls_return_sequences(synthetic_server: Server, demo_tokenizer, stream: bool) -> None:
    """The BLS demultiplexes the engine's interleaved sequences by sequence_index: each one's
    text is whole (sequence i is the synthetic engine's output for seed i)."""
    prompt = PROMPTS[1]
    result = await generate_sequences(
        synthetic_server.url, BLS, prompt, 24, 2, stream=stream, request_id=uuid.uuid4().hex
    )
    assert result.error is None, result.error
    assert result.texts == {i: expected_text(demo_tokenizer, prompt, 24, seed=i) for i in range(2)}
    assert result.texts[0] != result.texts[1]


async def test_ensemble_passes_return_sequences(synthetic_server: Server, demo_tokenizer) -> None:
    """The ensemble forwards num_return_sequences and returns sequence_index. Not streamed and
    without a request id: postprocessing keeps detokenizer state per (request id, row), not per
    sequence, so only whole sequences decoded statelessly come out exact."""
    prompt = PROMPTS[0]
    result = await generate_sequences(
        synthetic_server.url, ENSEMBLE, prompt, 16, 3, stream=False, request_id=""
    )
    assert result.error is None, result.error
    assert result.responses == 3  # one whole response per sequence
    assert result.texts == {i: expected_text(demo_tokenizer, prompt, 16, seed=i) for i in range(3)}


# ----- the python models called directly -------------------------------------------------------


async def test_preprocessing_outputs(synthetic_server: Server, demo_tokenizer) -> None:
    def tensor(name, value, dtype):
        item = grpcclient.InferInput(name, list(value.shape), dtype)
        item.set_data_from_numpy(value)
        return item

    prompts = ["Grüße", "The lighthouse keeper"]
    inputs = [
        tensor("QUERY", np.array([[p.encode()] for p in prompts], dtype=object), "BYTES"),
        tensor("REQUEST_OUTPUT_LEN", np.array([[7], [9]], dtype=np.int32), "INT32"),
        tensor("STOP_WORDS_DICT", np.array([[b"keeper", b""], [b"", b""]], dtype=object), "BYTES"),
        tensor("EMBEDDING_BIAS_WORDS", np.array([[b"keeper"], [b"dawn"]], dtype=object), "BYTES"),
        tensor("EMBEDDING_BIAS_WEIGHTS", np.array([[1.5], [-2.0]], dtype=np.float32), "FP32"),
    ]
    async with grpcclient.InferenceServerClient(synthetic_server.url) as client:
        result = await client.infer("preprocessing", inputs)
    ids = [demo_tokenizer.encode(p) for p in prompts]
    width = max(map(len, ids))
    input_id = result.as_numpy("INPUT_ID")
    assert input_id.shape == (2, width)
    assert input_id[0].tolist() == ids[0] + [demo_tokenizer.pad_token_id] * (width - len(ids[0]))
    assert result.as_numpy("REQUEST_INPUT_LEN").tolist() == [[len(ids[0])], [len(ids[1])]]
    assert result.as_numpy("REQUEST_OUTPUT_LEN").tolist() == [[7], [9]]
    keeper = demo_tokenizer.encode("keeper", add_special_tokens=False)
    stop = result.as_numpy("STOP_WORDS_IDS")
    assert stop.shape == (2, 2, len(keeper))
    assert stop[0, 0].tolist() == keeper and stop[0, 1, 0] == len(keeper)
    assert stop[1, 1].tolist() == [-1] * len(keeper)
    assert result.as_numpy("BAD_WORDS_IDS").shape == (2, 2, 0)
    bias = result.as_numpy("EMBEDDING_BIAS")
    assert bias.shape == (2, len(demo_tokenizer))
    assert all(bias[0, t] == 1.5 for t in keeper)
    assert result.as_numpy("OUT_END_ID").tolist() == [[EOS_ID], [EOS_ID]]
    assert result.as_numpy("OUT_PAD_ID").tolist() == [[demo_tokenizer.pad_token_id]] * 2
    assert result.as_numpy("DECODER_INPUT_ID") is None


async def test_postprocessing_keeps_state_per_request_id(
    synthetic_server: Server, demo_tokenizer
) -> None:
    """One call per token with the same request id: multi-byte characters survive the borders."""
    text = "Grüße 日本語 🙂 café"
    ids = demo_tokenizer.encode(text, add_special_tokens=False)
    assert any("\ufffd" in decode(demo_tokenizer, [i]) for i in ids)  # split characters in there

    async def call(client, chunk: list[int], request_id: str) -> str:
        tokens = grpcclient.InferInput("TOKENS_BATCH", [1, 1, len(chunk)], "INT32")
        tokens.set_data_from_numpy(np.array([[chunk]], dtype=np.int32))
        lengths = grpcclient.InferInput("SEQUENCE_LENGTH", [1, 1], "INT32")
        lengths.set_data_from_numpy(np.array([[len(chunk)]], dtype=np.int32))
        result = await client.infer("postprocessing", [tokens, lengths], request_id=request_id)
        return result.as_numpy("OUTPUT").reshape(-1)[0].decode("utf-8")

    async with grpcclient.InferenceServerClient(synthetic_server.url) as client:
        request_id = uuid.uuid4().hex
        pieces = [await call(client, [i], request_id) for i in ids]
        assert "".join(pieces) == text
        assert all("\ufffd" not in piece for piece in pieces)
        # Without a request id every call stands alone (NVIDIA's behaviour).
        alone = [await call(client, [i], "") for i in ids]
        assert "".join(alone) != text


# ----- the demo Llama (hf mode) -----------------------------------------------------------------


@pytest.mark.parametrize("model", [ENSEMBLE, BLS])
async def test_hf_engine_streaming_matches_non_streaming(hf_server: Server, model: str) -> None:
    for prompt in PROMPTS[1:3]:
        whole = await generate(hf_server.url, model, prompt, 24, stream=False)
        streamed = await generate(hf_server.url, model, prompt, 24, stream=True)
        assert whole.error is None and streamed.error is None, (whole.error, streamed.error)
        assert whole.text
        assert streamed.text == whole.text
