"""The llmapi model on its CPU stand-in (python_models/llmapi/cpu.py), without Triton: the
LLM API's contract on the CPU engine's scheduler, with the synthetic backend (predictable
tokens) and the demo checkpoint's transformers model (real logits: alternatives, guides)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
from cpu_engine_helpers import EOS, VOCAB
from llmapi_harness import (
    MetricFamily,
    model_module,
    start_model,
    text_request,
    token_request,
    wait_for,
    write_version_dir,
)

from tensorrtllm_backend.common.cpu_engine_config import write_engine_dir
from tensorrtllm_backend.python_models.cpu_engine.synthetic import predict_tokens

PROMPT = [1, 40, 300, 42]
TRITON = {"max_batch_size": 0, "decoupled": True}


def synthetic_engine(root: Path, tokenizer_dir: Path, itl_ms: float) -> Path:
    """A synthetic CPU engine dir with the demo tokenizer beside it (--synthetic --workflow
    llmapi's `checkpoint/`)."""
    engine = write_engine_dir(
        root / "checkpoint", mode="synthetic", vocab_size=VOCAB, eos_token_id=EOS,
        max_input_len=64, max_seq_len=128, itl_ms=itl_ms,
    )  # fmt: skip
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, engine / name)
    return engine


@pytest.fixture
def synthetic_dir(tmp_path: Path, demo_checkpoint: Path) -> Path:
    return synthetic_engine(tmp_path / "fast", demo_checkpoint, itl_ms=1)


@pytest.fixture
def slow_dir(tmp_path: Path, demo_checkpoint: Path) -> Path:
    """20 ms a token: requests stay in flight long enough to act on them."""
    return synthetic_engine(tmp_path / "slow", demo_checkpoint, itl_ms=20)


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("TRTLLM_LLMAPI_IMPL", "cpu")
    module = model_module(monkeypatch)
    started = []

    def start(model: Path, **llm_args):
        settings = {"model": str(model), "backend": "pytorch", "triton_config": TRITON, **llm_args}
        version_dir = write_version_dir(tmp_path / f"run{len(started)}", settings)
        started.append(start_model(module, version_dir))
        return started[-1]

    yield start
    for model in started:
        model.finalize()


def ids_of(responses: list[dict]) -> list[int]:
    return [token for response in responses for token in response["output_ids"]]


def test_token_ids_stream_the_engines_tokens(serve, synthetic_dir) -> None:
    model = serve(synthetic_dir)
    request = token_request(PROMPT, streaming=True, sampling_param_max_tokens=6,
                            sampling_param_exclude_input_from_output=True,
                            return_finish_reason=True, sampling_param_logprobs=2)  # fmt: skip
    model.execute([request])
    responses = request.wait()
    assert ids_of(responses) == predict_tokens(PROMPT, 6, vocab_size=VOCAB, eos_token_id=EOS)
    assert responses[-1]["finish_reason"] == ["length"]
    assert all(r["finish_reason"] == ["None"] for r in responses[:-1])
    tops = [row for r in responses for row in r["output_top_log_probs"]]
    assert tops == [[0.0, float("-inf")]] * 6  # certain of each token: alternatives impossible


def test_stream_interval_groups_tokens_after_the_first(serve, synthetic_dir) -> None:
    model = serve(synthetic_dir, stream_interval=3)
    request = token_request(PROMPT, streaming=True, sampling_param_max_tokens=8,
                            sampling_param_exclude_input_from_output=True)  # fmt: skip
    model.execute([request])
    responses = request.wait()
    assert [len(r["output_ids"]) for r in responses] == [1, 3, 3, 1]
    assert ids_of(responses) == predict_tokens(PROMPT, 8, vocab_size=VOCAB, eos_token_id=EOS)


def test_several_sequences_sample_with_seed_plus_i(serve, synthetic_dir) -> None:
    model = serve(synthetic_dir)
    request = token_request(PROMPT, streaming=True, sampling_param_max_tokens=4,
                            sampling_param_n=3, sampling_param_seed=5,
                            sampling_param_exclude_input_from_output=True)  # fmt: skip
    model.execute([request])
    by_index: dict[int, list[int]] = {}
    for response in request.wait():
        by_index.setdefault(response["sequence_index"][0], []).extend(response["output_ids"])
    assert by_index == {
        i: predict_tokens(PROMPT, 4, vocab_size=VOCAB, eos_token_id=EOS, seed=5 + i)
        for i in range(3)
    }


def test_nvidias_text_request(serve, synthetic_dir, demo_tokenizer) -> None:
    model = serve(synthetic_dir)
    request = text_request("Once upon a time", streaming=False, sampling_param_max_tokens=5,
                           return_finish_reason=True)  # fmt: skip
    model.execute([request])
    (response,) = request.wait()
    prompt = demo_tokenizer.encode("Once upon a time")
    tokens = predict_tokens(prompt, 5, vocab_size=VOCAB, eos_token_id=EOS)
    assert response["text_output"] == ["Once upon a time" + demo_tokenizer.decode(tokens)]
    assert response["finish_reason"] == ["length"]


def test_a_stop_string_ends_the_sequence_where_the_text_holds_it(
    serve, slow_dir, demo_tokenizer
) -> None:
    model = serve(slow_dir)
    prompt = demo_tokenizer.encode("Once upon a time")
    text = demo_tokenizer.decode(predict_tokens(prompt, 12, vocab_size=VOCAB, eos_token_id=EOS))
    stop = next(text[i : i + 2] for i in range(4, len(text)) if text[i : i + 2].isalpha())
    for streaming in (True, False):
        request = text_request(
            "Once upon a time", streaming=streaming, sampling_param_max_tokens=12,
            sampling_param_stop=["never in it", stop], return_finish_reason=True,
            return_stop_reason=True, sampling_param_exclude_input_from_output=True,
        )  # fmt: skip
        model.execute([request])
        last = request.wait()[-1]
        assert last["text_output"] == [text[: text.index(stop)]]
        assert (last["finish_reason"], last["stop_reason"]) == (["stop"], [stop])
    ids = token_request(prompt, streaming=True, sampling_param_max_tokens=12,
                        sampling_param_stop=[stop], return_finish_reason=True,
                        sampling_param_exclude_input_from_output=True)  # fmt: skip
    model.execute([ids])
    responses = ids.wait()
    assert responses[-1]["finish_reason"] == ["stop"]
    assert stop in demo_tokenizer.decode(ids_of(responses)) and len(ids_of(responses)) < 12


def test_abort_ends_the_request_as_cancelled(serve, slow_dir) -> None:
    model = serve(slow_dir)
    running = token_request(PROMPT, "r1", streaming=True, sampling_param_max_tokens=60,
                            return_finish_reason=True)  # fmt: skip
    model.execute([running])
    wait_for(lambda: len(running.sender.responses) >= 2)
    model.execute([token_request(PROMPT, "r1", stop=True)])
    assert running.wait()[-1]["finish_reason"] == ["cancelled"]
    gone = token_request(PROMPT, streaming=True, sampling_param_max_tokens=60)
    model.execute([gone])
    wait_for(lambda: len(gone.sender.responses) >= 2)
    gone.sender.cancel()
    wait_for(lambda: model.engine.scheduler.stats().cancelled == 2, timeout=5)
    # The counters reach Triton's metrics, as the tensorrt_llm CPU engine's do.
    published = MetricFamily.values.setdefault("trtllm_cpu_engine_cancelled_requests_total", {})
    wait_for(lambda: sum(published.values()) >= 2, timeout=5)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"lora_id": 1, "lora_name": "a", "lora_path": "/x"}, "LoRA adapters need tensorrt_llm"),
        ({"sampling_param_n": 2, "sampling_param_best_of": 3}, "best_of"),
        ({"guided_decoding_guide_type": "json"}, "synthetic CPU engine has none"),
        ({"guided_decoding_guide_type": "xml"}, "is not one of json, json_schema"),
        ({"guided_decoding_guide": "[a-z]"}, "needs 'guided_decoding_guide_type'"),
        ({"sampling_param_max_tokens": 500}, "max_seq_len 128"),
        ({"streaming": True, "sampling_param_logprobs": 21}, "logprobs must be 0 to 20"),
    ],
)
def test_what_the_stand_in_cannot_do_is_that_requests_error(
    serve, synthetic_dir, extra, message
) -> None:
    model = serve(synthetic_dir)
    request = token_request(PROMPT, **extra)
    model.execute([request])
    assert message in (request.error() or "")


SCHEMA = {
    "type": "object",
    "properties": {"sky": {"enum": ["clear", "rain"]}, "windy": {"type": "boolean"}},
    "required": ["sky", "windy"],
    "additionalProperties": False,
}


def test_hf_checkpoint_follows_a_guide_and_ranks_alternatives(
    serve, demo_checkpoint, demo_tokenizer
) -> None:
    model = serve(demo_checkpoint, guided_decoding_backend="xgrammar", max_seq_len=512)
    guided = token_request(
        demo_tokenizer.encode("The weather:"), streaming=True, sampling_param_max_tokens=64,
        sampling_param_temperature=1.0, sampling_param_top_k=20, sampling_param_seed=3,
        sampling_param_exclude_input_from_output=True, return_finish_reason=True,
        guided_decoding_guide_type="json_schema", guided_decoding_guide=json.dumps(SCHEMA),
    )  # fmt: skip
    ranked = token_request(demo_tokenizer.encode("Hello"), sampling_param_max_tokens=4,
                           sampling_param_exclude_input_from_output=True,
                           sampling_param_logprobs=3)  # fmt: skip
    model.execute([guided, ranked])
    responses = guided.wait()
    assert responses[-1]["finish_reason"] == ["stop"]
    jsonschema.validate(json.loads(demo_tokenizer.decode(ids_of(responses))), SCHEMA)
    (response,) = ranked.wait()
    for token, lp, ids, lps in zip(
        response["output_ids"], response["output_log_probs"],
        response["output_top_token_ids"], response["output_top_log_probs"], strict=True,
    ):  # fmt: skip
        assert ids[0] == token and lps[0] == pytest.approx(lp)  # greedy: the most likely
        assert lps == sorted(lps, reverse=True) and len(set(ids)) == 3
