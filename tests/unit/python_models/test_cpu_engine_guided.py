"""The CPU engine's guided step: the demo model (random weights) under a grammar matcher produces
output that follows the guide, ends on its end token once the guide is complete, and shares the
batch with unguided requests."""

from __future__ import annotations

import json
import os
import re

import pytest
from cpu_engine_helpers import make_request, make_sequences

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from tensorrtllm_backend.build.demo import build_demo_checkpoint  # noqa: E402
from tensorrtllm_backend.common.tokenization import load_tokenizer  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.hf import HFBackend  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.request import FinishReason, SamplingParams  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler  # noqa: E402
from tensorrtllm_backend.serving.guided import GuideCompiler  # noqa: E402
from tensorrtllm_backend.serving.schemas import GuidedDecoding  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "sky": {"enum": ["clear", "cloudy", "rain"]},
        "windy": {"type": "boolean"},
        "hours": {"type": "array", "items": {"enum": ["am", "pm"]}, "maxItems": 3},
        "wind": {
            "type": "object",
            "properties": {"strong": {"type": "boolean"}},
            "required": ["strong"],
            "additionalProperties": False,
        },
    },
    "required": ["city", "sky", "windy", "hours", "wind"],
    "additionalProperties": False,
}
END = 2
SAMPLED = SamplingParams(temperature=1.0, top_k=50, seed=7)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_demo_checkpoint(tmp_path_factory.mktemp("demo") / "ckpt")


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return load_tokenizer(checkpoint)


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GuideCompiler(tokenizer, vocab_size=len(tokenizer))


@pytest.fixture(scope="module")
def scheduler(checkpoint):
    sched = Scheduler(HFBackend(checkpoint, num_threads=1), max_batch_size=16)
    sched.start()
    yield sched
    sched.stop()


def run(scheduler, requests, timeout=120.0):
    for req, _ in requests:
        scheduler.submit(req)
    for _, sink in requests:
        assert sink.done.wait(timeout)
        assert sink.error is None, sink.error


def guided_request(tokenizer, compiler, kind, guide, max_new_tokens=300, **kwargs):
    grammar = compiler.compile(GuidedDecoding(type=kind, guide=guide))
    prompt = tokenizer.encode("Today's weather, as JSON:")
    return make_request(
        prompt, max_new_tokens, end_id=END, grammar=grammar, guided=(kind, guide), **kwargs
    )


@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
def test_schema_output_validates_and_ends_on_the_end_token(
    scheduler, tokenizer, compiler, sampling
) -> None:
    pair = guided_request(
        tokenizer, compiler, "json_schema", json.dumps(SCHEMA), streaming=True, sampling=sampling
    )
    run(scheduler, [pair])
    req, sink = pair
    assert sink.reason is FinishReason.END_ID and req.guide_ended
    assert END not in req.generated  # the end token is not output, as TensorRT-LLM
    assert sink.streamed() == req.generated
    jsonschema.validate(json.loads(tokenizer.decode(req.generated)), SCHEMA)


def test_one_matcher_per_sequence(scheduler, tokenizer, compiler) -> None:
    grammar = compiler.compile(GuidedDecoding(type="json_schema", guide=json.dumps(SCHEMA)))
    prompt = tokenizer.encode("Weather:")
    pairs = make_sequences(prompt, 300, 4, end_id=END, grammar=grammar, sampling=SAMPLED)
    run(scheduler, pairs)
    texts = [tokenizer.decode(req.generated) for req, _ in pairs]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(texts)) > 1


def test_guided_and_unguided_share_a_batch(scheduler, tokenizer, compiler) -> None:
    prompt = tokenizer.encode("Once upon a time")
    alone = make_request(prompt, 24, end_id=None)
    run(scheduler, [alone])
    regex = r"[a-z]{2,6}-[0-9]{3}"
    batch = [
        guided_request(tokenizer, compiler, "regex", regex, sampling=SAMPLED),
        make_request(prompt, 24, end_id=None),
        guided_request(tokenizer, compiler, "json_schema", json.dumps(SCHEMA)),
        make_request(prompt, 24, end_id=None),
    ]
    run(scheduler, batch)
    assert re.fullmatch(regex, tokenizer.decode(batch[0][0].generated))
    jsonschema.validate(json.loads(tokenizer.decode(batch[2][0].generated)), SCHEMA)
    # The unguided requests decode exactly as without guided neighbours.
    assert batch[1][0].generated == batch[3][0].generated == alone[0].generated


def test_max_tokens_still_caps_a_guided_sequence(scheduler, tokenizer, compiler) -> None:
    pair = guided_request(tokenizer, compiler, "json_schema", json.dumps(SCHEMA), max_new_tokens=5)
    run(scheduler, [pair])
    req, sink = pair
    assert sink.reason is FinishReason.LENGTH and len(req.generated) == 5
    assert tokenizer.decode(req.generated).startswith("{")


def test_min_tokens_yields_to_the_guide(scheduler, tokenizer, compiler) -> None:
    """A guide complete before min_tokens may only end: the guide wins over the end-token ban."""
    grammar = 'root ::= "yes" | "no"'
    pair = guided_request(tokenizer, compiler, "ebnf_grammar", grammar, min_tokens=20)
    run(scheduler, [pair])
    req, sink = pair
    assert tokenizer.decode(req.generated) in ("yes", "no")
    assert sink.reason is FinishReason.END_ID
