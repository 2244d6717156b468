"""Guide checks and the compile cache (tensorrtllm_backend.common.guides), and the guide tensors each
route sends. The tokenizer is the demo model's, trained locally."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

from tensorrtllm_backend.common.guides import (
    MAX_DEPTH,
    Guide,
    GuideBusyError,
    GuideCompiler,
    GuideError,
    check_guide_text,
    json_depth,
)
from tensorrtllm_backend.packing.demo import BOS, EOS, PAD, train_tokenizer
from tensorrtllm_backend.serving.generation import EngineLimits, Generator
from tensorrtllm_backend.serving.request_errors import RequestError
from tensorrtllm_backend.serving.schemas import GuidedDecoding, SamplingParams
from tensorrtllm_backend.serving.triton_paths import Route
from tensorrtllm_backend.triton.client import TritonLLMClient

pytest.importorskip("xgrammar")

LIMITS = EngineLimits(max_input_len=64, max_seq_len=512, max_beam_width=1, max_batch_size=4)
SCHEMA = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}})


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(), bos_token=BOS, eos_token=EOS, pad_token=PAD
    )


@pytest.fixture
def compiler(tokenizer) -> GuideCompiler:
    return GuideCompiler(tokenizer)


@pytest.mark.parametrize(
    ("guided", "message"),
    [
        (GuidedDecoding(type="regex"), "needs a guide"),
        (GuidedDecoding(type="ebnf_grammar", guide="  "), "needs a guide"),
        (GuidedDecoding(type="json_schema", guide="{'a': 1}"), "not valid JSON"),
        (GuidedDecoding(type="json_schema", guide='{"type": "objekt"}'), "not a valid JSON Schema"),
        (GuidedDecoding(type="json_schema", guide="[1, 2]"), "expected an object, got list"),
        (GuidedDecoding(type="structural_tag", guide="{oops"), "not valid JSON"),
    ],
)
def test_guides_refused_before_compiling(guided: GuidedDecoding, message: str) -> None:
    with pytest.raises(GuideError, match=message):
        check_guide_text(guided)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        # the draft the schema names: draft 4's exclusiveMaximum is a boolean, 2020-12's a number
        ({"$schema": "http://json-schema.org/draft-04/schema#", "exclusiveMaximum": 3}, "boolean"),
        ({"exclusiveMaximum": True}, "number"),
        ({"properties": {"a": {"minimum": "x"}}}, r"number.*\(at /properties/a/minimum\)"),
        # an unknown $schema is checked as 2020-12, never fetched (the host does not exist)
        ({"$schema": "http://schemas.invalid/x", "type": "objekt"}, "not valid under any"),
    ],
)
def test_schemas_are_checked_by_their_drafts_meta_schema(schema: dict, message: str) -> None:
    with pytest.raises(GuideError, match=f"not a valid JSON Schema: .*{message}"):
        check_guide_text(GuidedDecoding(type="json_schema", guide=json.dumps(schema)))


def test_a_valid_schema_naming_an_unknown_draft_passes() -> None:
    schema = {"$schema": "http://schemas.invalid/x", "type": "object"}
    check_guide_text(GuidedDecoding(type="json_schema", guide=json.dumps(schema)))


@pytest.mark.parametrize(
    ("guided", "message"),
    [
        (
            GuidedDecoding(type="regex", guide="(ab"),
            "regex guide does not compile: .*parenthesis is not closed",
        ),
        (GuidedDecoding(type="ebnf_grammar", guide="root ::= x"), 'Rule "x" is not defined'),
        (GuidedDecoding(type="json_schema", guide='{"$ref": "#/nope"}'), "Cannot find field"),
    ],
)
def test_compiler_message_is_quoted_without_native_noise(
    compiler: GuideCompiler, guided: GuidedDecoding, message: str
) -> None:
    with pytest.raises(GuideError, match=message) as raised:
        compiler.compile(guided)
    assert ".cc:" not in str(raised.value) and "Check failed" not in str(raised.value)


def test_compiled_grammars_are_cached_by_type_and_guide(compiler: GuideCompiler) -> None:
    schema = GuidedDecoding(type="json_schema", guide=SCHEMA)
    first = compiler.compile(schema)
    assert compiler.compile(GuidedDecoding(type="json_schema", guide=SCHEMA)) is first
    assert compiler.compile(GuidedDecoding(type="json", guide=SCHEMA)) is not first
    bad = GuidedDecoding(type="regex", guide="[z-a]")
    with pytest.raises(GuideError) as once:
        compiler.compile(bad)
    assert compiler.cached(GuidedDecoding(type="json_schema", guide=SCHEMA)) is first
    with pytest.raises(GuideError) as twice:
        compiler.cached(bad)  # the failure is remembered, not compiled again
    assert twice.value is once.value


def test_cache_is_bounded_in_bytes(tokenizer) -> None:
    guides = [GuidedDecoding(type="regex", guide=f"{n}[a-z]{{3}}") for n in range(4)]
    probe = GuideCompiler(tokenizer)
    probe.compile(guides[0])
    one = probe.cached_bytes  # what one such grammar costs
    compiler = GuideCompiler(tokenizer, cache_bytes=int(one * 2.5))
    for guided in guides:
        compiler.compile(guided)
        assert compiler.cached_bytes <= int(one * 2.5)
    assert compiler.cached(guides[0]) is None  # the oldest went first
    assert compiler.cached(guides[3]) is not None


async def test_concurrent_checks_share_one_compilation(compiler: GuideCompiler, monkeypatch):
    calls = []
    compile_for_real = compiler._compile

    def counting(guided: GuidedDecoding):
        calls.append(guided)
        return compile_for_real(guided)

    monkeypatch.setattr(compiler, "_compile", counting)
    guided = GuidedDecoding(type="json_schema", guide=SCHEMA)
    await asyncio.gather(*(compiler.check(guided) for _ in range(8)))
    assert len(calls) == 1
    await compiler.check(guided)
    assert len(calls) == 1


async def test_compiling_leaves_the_event_loop_free(compiler: GuideCompiler) -> None:
    """Compilation runs in a thread: the loop keeps ticking meanwhile."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(ticker())
    properties = {f"field{i}": {"type": "string", "pattern": "[a-z]{2,9}"} for i in range(40)}
    big = json.dumps({"type": "object", "properties": properties, "required": list(properties)})
    await compiler.check(GuidedDecoding(type="json_schema", guide=big))
    task.cancel()
    assert ticks > 1


# The routes whose models take [1, 1] tensors (the llmapi model's are one-dimensional).
ENGINE_ROUTES = [route for route in Route if route is not Route.LLMAPI]


def _generator(tokenizer, route: Route, **kwargs) -> Generator:
    """Call from async tests: grpc.aio binds a client's channel to the running event loop."""
    return Generator(TritonLLMClient("127.0.0.1:1"), tokenizer, LIMITS, route=route, **kwargs)


@pytest.mark.parametrize("route", ENGINE_ROUTES)
async def test_every_route_sends_the_guide_tensors(tokenizer, route: Route) -> None:
    generator = _generator(tokenizer, route)
    params = SamplingParams(guided_decoding=GuidedDecoding(type="json_schema", guide=SCHEMA))
    tensors, _ = generator._triton_inputs(generator.prepare("Hi", params), False)
    guide_type = tensors["guided_decoding_guide_type"]
    guide = tensors["guided_decoding_guide"]
    assert guide_type.dtype == np.object_ and guide_type.tolist() == [[b"json_schema"]]
    assert guide.dtype == np.object_ and guide.tolist() == [[SCHEMA.encode()]]


@pytest.mark.parametrize("route", ENGINE_ROUTES)
async def test_json_without_guide_sends_the_type_alone(tokenizer, route: Route) -> None:
    generator = _generator(tokenizer, route)
    params = SamplingParams(guided_decoding=GuidedDecoding(type="json"))
    tensors, _ = generator._triton_inputs(generator.prepare("Hi", params), False)
    assert tensors["guided_decoding_guide_type"].tolist() == [[b"json"]]
    assert "guided_decoding_guide" not in tensors


async def test_the_llmapi_route_sends_the_guide_tensors(tokenizer) -> None:
    generator = _generator(tokenizer, Route.LLMAPI)
    params = SamplingParams(guided_decoding=GuidedDecoding(type="json_schema", guide=SCHEMA))
    tensors, _ = generator._triton_inputs(generator.prepare("Hi", params), False)
    assert tensors["guided_decoding_guide_type"].tolist() == [b"json_schema"]
    assert tensors["guided_decoding_guide"].tolist() == [SCHEMA.encode()]
    json_only = SamplingParams(guided_decoding=GuidedDecoding(type="json"))
    tensors, _ = generator._triton_inputs(generator.prepare("Hi", json_only), False)
    assert tensors["guided_decoding_guide_type"].tolist() == [b"json"]
    assert "guided_decoding_guide" not in tensors


async def test_unguided_request_sends_no_guide_tensor(tokenizer) -> None:
    generator = _generator(tokenizer, Route.DIRECT)
    tensors, _ = generator._triton_inputs(generator.prepare("Hi", SamplingParams()), False)
    assert not any(name.startswith("guided_decoding") for name in tensors)


async def test_generator_turns_guide_errors_into_request_errors(tokenizer) -> None:
    generator = _generator(tokenizer, Route.DIRECT)
    with pytest.raises(RequestError, match="needs a guide") as raised:
        generator.prepare("Hi", SamplingParams(guided_decoding=GuidedDecoding(type="regex")))
    assert raised.value.param == "guided_decoding" and raised.value.status == 400
    prepared = generator.prepare(
        "Hi", SamplingParams(guided_decoding=GuidedDecoding(type="regex", guide="[0-"))
    )
    with pytest.raises(RequestError, match="does not compile"):
        await generator.check_guide(prepared)
    await generator.client.close()


async def test_model_without_guided_decoding_refuses_guides(tokenizer) -> None:
    generator = _generator(tokenizer, Route.DIRECT, guides_unsupported="guided decoding is off")
    with pytest.raises(RequestError, match="guided decoding is off"):
        generator.prepare("Hi", SamplingParams(guided_decoding=GuidedDecoding(type="json")))
    generator.prepare("Hi", SamplingParams())  # unguided requests are served as before


class SlowCompiles:
    """Replaces a compiler's xgrammar call with one that waits until released (a guide that
    takes xgrammar minutes), counting the calls."""

    def __init__(self, compiler: GuideCompiler, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.release = threading.Event()
        real = compiler._compile

        def slow(guided: GuidedDecoding):
            self.calls += 1
            self.release.wait(10)
            return real(guided)

        monkeypatch.setattr(compiler, "_compile", slow)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_slow_compile_is_a_400_and_its_failure_is_remembered(tokenizer, monkeypatch):
    clock = Clock()
    compiler = GuideCompiler(tokenizer, timeout_s=0.3, failure_ttl_s=60, clock=clock)
    slow = SlowCompiles(compiler, monkeypatch)
    guided = GuidedDecoding(type="regex", guide="[a-z]{5}")
    started = time.monotonic()
    with pytest.raises(GuideError, match="did not compile within 0.3 s"):
        clock.now += 0.3  # the compiler's clock says the time is up when the wait ends
        await compiler.check(guided)
    assert time.monotonic() - started < 5
    with pytest.raises(GuideError, match="did not compile within"):
        await compiler.check(guided)  # remembered: no second compilation
    assert slow.calls == 1
    slow.release.set()  # the compilation finishes late: the guide stays refused until its TTL
    await asyncio.sleep(0.1)
    with pytest.raises(GuideError):
        compiler.cached(guided)
    clock.now += 61
    assert compiler.cached(guided) is None  # forgotten: the next request compiles again
    await compiler.check(guided)
    assert slow.calls == 2 and compiler.cached(guided) is not None


async def test_a_full_compiler_answers_busy(tokenizer, monkeypatch):
    compiler = GuideCompiler(tokenizer, max_threads=1, max_pending=1, timeout_s=5)
    slow = SlowCompiles(compiler, monkeypatch)
    first = asyncio.ensure_future(compiler.check(GuidedDecoding(type="regex", guide="a+")))
    await asyncio.sleep(0.05)
    with pytest.raises(GuideBusyError, match="retry shortly"):
        await compiler.check(GuidedDecoding(type="regex", guide="b+"))
    slow.release.set()
    await first
    await compiler.check(GuidedDecoding(type="regex", guide="b+"))  # room again


async def test_a_guide_that_cannot_start_in_time_is_busy_not_invalid(tokenizer, monkeypatch):
    compiler = GuideCompiler(tokenizer, max_threads=1, max_pending=4, timeout_s=0.3)
    slow = SlowCompiles(compiler, monkeypatch)
    first = asyncio.ensure_future(compiler.check(GuidedDecoding(type="regex", guide="a+")))
    await asyncio.sleep(0.05)  # the first guide holds the only thread
    with pytest.raises(GuideBusyError, match="waited 0.3 s for a free thread"):
        await compiler.check(GuidedDecoding(type="regex", guide="b+"))
    slow.release.set()
    with pytest.raises(GuideError):
        await first  # its own 0.3 s ran out while it compiled
    assert compiler.cached(GuidedDecoding(type="regex", guide="b+")) is None  # not refused


def test_the_engine_side_compile_is_bounded_too(tokenizer, monkeypatch):
    compiler = GuideCompiler(tokenizer, timeout_s=0.2)
    slow = SlowCompiles(compiler, monkeypatch)
    with pytest.raises(GuideError, match="did not compile within 0.2 s"):
        compiler.compile(GuidedDecoding(type="regex", guide="c+"))
    slow.release.set()


@pytest.mark.parametrize("levels", [MAX_DEPTH // 2 + 1, 50_000])
def test_deeply_nested_guides_are_refused(levels: int) -> None:
    """Just past the limit, and deep enough to exhaust the JSON parser's recursion."""
    schema = '{"anyOf": [' * levels + "true" + "]}" * levels  # 2 levels each
    with pytest.raises(GuideError, match=f"nested more than {MAX_DEPTH} levels"):
        check_guide_text(Guide("json_schema", schema))
    fits = '{"anyOf": [' * (MAX_DEPTH // 2) + "true" + "]}" * (MAX_DEPTH // 2)
    check_guide_text(Guide("json_schema", fits))


def test_json_depth_counts_nesting() -> None:
    assert json_depth(1) == 0 and json_depth([]) == 1 and json_depth({"a": [{"b": 2}]}) == 3
