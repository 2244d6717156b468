"""The CPU engine's guided step: the demo model (random weights) under a grammar matcher produces
output that follows the guide, ends on its end token once the guide is complete, and shares the
batch with unguided requests."""

from __future__ import annotations

import json
import os
import re

import pytest
from cpu_engine_helpers import make_request, make_sequences, run_to_end

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from tensorrtllm_backend.common.guides import Guide, GuideCompiler  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.hf import HFBackend  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.request import FinishReason, SamplingParams  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler  # noqa: E402

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
def compiler(demo_tokenizer):
    return GuideCompiler(demo_tokenizer, vocab_size=len(demo_tokenizer))


@pytest.fixture(scope="module")
def scheduler(demo_checkpoint):
    sched = Scheduler(HFBackend(demo_checkpoint, num_threads=1, device="cpu"), max_batch_size=16)
    sched.start()
    yield sched
    sched.stop()


def guided_request(tokenizer, compiler, kind, guide, max_new_tokens=300, **kwargs):
    grammar = compiler.compile(Guide(kind, guide))
    prompt = tokenizer.encode("Today's weather, as JSON:")
    return make_request(
        prompt, max_new_tokens, end_id=END, grammar=grammar, guided=(kind, guide), **kwargs
    )


@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
def test_schema_output_validates_and_ends_on_the_end_token(
    scheduler, demo_tokenizer, compiler, sampling
) -> None:
    pair = guided_request(
        demo_tokenizer,
        compiler,
        "json_schema",
        json.dumps(SCHEMA),
        streaming=True,
        sampling=sampling,
    )
    run_to_end(scheduler, [pair])
    req, sink = pair
    assert sink.reason is FinishReason.END_ID and req.guide_ended
    assert END not in req.generated  # the end token is not output, as TensorRT-LLM
    assert sink.streamed() == req.generated
    jsonschema.validate(json.loads(demo_tokenizer.decode(req.generated)), SCHEMA)


def test_one_matcher_per_sequence(scheduler, demo_tokenizer, compiler) -> None:
    grammar = compiler.compile(Guide("json_schema", json.dumps(SCHEMA)))
    prompt = demo_tokenizer.encode("Weather:")
    pairs = make_sequences(prompt, 300, 4, end_id=END, grammar=grammar, sampling=SAMPLED)
    run_to_end(scheduler, pairs)
    texts = [demo_tokenizer.decode(req.generated) for req, _ in pairs]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(texts)) > 1


def test_guided_and_unguided_share_a_batch(scheduler, demo_tokenizer, compiler) -> None:
    prompt = demo_tokenizer.encode("Once upon a time")
    alone = make_request(prompt, 24, end_id=None)
    run_to_end(scheduler, [alone])
    regex = r"[a-z]{2,6}-[0-9]{3}"
    batch = [
        guided_request(demo_tokenizer, compiler, "regex", regex, sampling=SAMPLED),
        make_request(prompt, 24, end_id=None),
        guided_request(demo_tokenizer, compiler, "json_schema", json.dumps(SCHEMA)),
        make_request(prompt, 24, end_id=None),
    ]
    run_to_end(scheduler, batch)
    assert re.fullmatch(regex, demo_tokenizer.decode(batch[0][0].generated))
    jsonschema.validate(json.loads(demo_tokenizer.decode(batch[2][0].generated)), SCHEMA)
    # The unguided requests decode exactly as without guided neighbours.
    assert batch[1][0].generated == batch[3][0].generated == alone[0].generated


def test_max_tokens_still_caps_a_guided_sequence(scheduler, demo_tokenizer, compiler) -> None:
    pair = guided_request(
        demo_tokenizer, compiler, "json_schema", json.dumps(SCHEMA), max_new_tokens=5
    )
    run_to_end(scheduler, [pair])
    req, sink = pair
    assert sink.reason is FinishReason.LENGTH and len(req.generated) == 5
    assert demo_tokenizer.decode(req.generated).startswith("{")


def test_min_tokens_yields_to_the_guide(scheduler, demo_tokenizer, compiler) -> None:
    """A guide complete before min_tokens may only end: the guide wins over the end-token ban."""
    grammar = 'root ::= "yes" | "no"'
    pair = guided_request(demo_tokenizer, compiler, "ebnf_grammar", grammar, min_tokens=20)
    run_to_end(scheduler, [pair])
    req, sink = pair
    assert demo_tokenizer.decode(req.generated) in ("yes", "no")
    assert sink.reason is FinishReason.END_ID
