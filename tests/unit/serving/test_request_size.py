"""Work that grows with a request stays off the event loop or is cheap by construction: the
offloader's threshold, tokenizing without building the ids of a prompt that is too long, the
tools' duplicate check in linear time, guides over the length limit refused by field, unknown
field names logged once and escaped, and the chat template's errors told apart."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from tiny_tokenizers import byte_level_bpe  # tests/unit/tiny_tokenizers.py
from transformers import PreTrainedTokenizerFast

from tensorrtllm_backend.packing.demo import BOS, CHAT_TEMPLATE, EOS, PAD, train_tokenizer
from tensorrtllm_backend.serving.chat.core import ChatCore
from tensorrtllm_backend.serving.chat.output_format import output_constraint
from tensorrtllm_backend.serving.chat.tools import plan_tools
from tensorrtllm_backend.serving.generation import EngineLimits, Generator
from tensorrtllm_backend.serving.offload import INLINE_MAX_CHARS, Offloader
from tensorrtllm_backend.serving.openai_api.protocol import ChatCompletionRequest
from tensorrtllm_backend.serving.prompt_ids import MAX_CHARS_PER_TOKEN, encode_prompt
from tensorrtllm_backend.serving.request_errors import RequestError
from tensorrtllm_backend.serving.schemas import MAX_GUIDE_CHARS, SamplingParams
from tensorrtllm_backend.serving.web.endpoints import UnknownFieldLog
from tensorrtllm_backend.triton.client import TritonLLMClient

LIMITS = EngineLimits(max_input_len=64, max_seq_len=512, max_beam_width=1, max_batch_size=4)
MODEL = "demo"


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(), bos_token=BOS, eos_token=EOS, pad_token=PAD
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


async def test_small_work_stays_inline_and_large_work_goes_to_the_pool() -> None:
    offloader = Offloader(threads=1)
    where = await offloader.run(INLINE_MAX_CHARS, lambda: threading.current_thread().name)
    assert where == threading.main_thread().name
    where = await offloader.run(INLINE_MAX_CHARS + 1, lambda: threading.current_thread().name)
    assert where.startswith("trtllm-request")
    offloader.close()


async def test_the_loop_keeps_turning_while_a_large_prompt_is_tokenized(tokenizer) -> None:
    limits = EngineLimits(max_input_len=100_000, max_seq_len=200_000)
    generator = Generator(TritonLLMClient("127.0.0.1:1"), tokenizer, limits)
    prompt = "Once upon a time € " * 40_000  # 760k characters, ~350k tokens
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.ensure_future(ticker())
    try:
        with pytest.raises(RequestError, match="max_input_len") as raised:
            await generator.admit(prompt, SamplingParams())
    finally:
        ticking.cancel()
        await generator.client.close()
    assert raised.value.param == "prompt"
    assert len(gaps) > 10 and max(gaps) < 0.25, f"the loop stalled for {max(gaps):.3f} s"


def test_a_prompt_too_long_for_any_tokenization_is_refused_unread(tokenizer, monkeypatch) -> None:
    generator = Generator(TritonLLMClient.__new__(TritonLLMClient), tokenizer, LIMITS)
    monkeypatch.setattr(generator, "tokenizer", None)  # never reached
    prompt = "x" * (LIMITS.max_input_len * MAX_CHARS_PER_TOKEN + 1)
    with pytest.raises(RequestError, match="max_input_len of 64 tokens") as raised:
        generator.prepare(prompt, SamplingParams())
    assert raised.value.param == "prompt"


@pytest.mark.parametrize("special", [True, False])
@pytest.mark.parametrize("kind", ["served", "trained", "byte_level_bpe"])
def test_encoding_matches_the_tokenizers_own(request, tokenizer, kind: str, special: bool) -> None:
    if kind == "served":  # the demo model's, loaded as the service loads it
        chosen = request.getfixturevalue("demo_tokenizer")
    elif kind == "trained":
        chosen = tokenizer
    else:
        chosen = byte_level_bpe(["Once upon a time", "tabs\tand € signs"], 300, bos_token="<s>")
    for text in ("Once upon a time", " leading space", "€ and ünïcödé\n\ttabs", "x" * 300):
        expected = chosen.encode(text, add_special_tokens=special)
        assert encode_prompt(chosen, text, special, 10_000) == expected
        assert encode_prompt(chosen, text, special, len(expected) - 1) == len(expected)


def test_duplicate_tool_names_are_found_in_linear_time() -> None:
    tools = [{"type": "function", "function": {"name": f"t{i}"}} for i in range(20_000)]
    tools += [{"type": "function", "function": {"name": "t7"}}]
    request = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    )
    started = time.perf_counter()
    with pytest.raises(RequestError, match="unique: t7"):
        plan_tools(request, None, True)
    assert time.perf_counter() - started < 2.0  # the quadratic check took minutes for this


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"guided_regex": "a" * (MAX_GUIDE_CHARS + 1)}, "guided_regex"),
        ({"guided_json": {"enum": ["x" * MAX_GUIDE_CHARS]}}, "guided_json"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "big", "schema": {"enum": ["x" * MAX_GUIDE_CHARS]}},
                }
            },
            "response_format",
        ),
    ],
)
def test_a_guide_over_the_length_limit_names_its_field(fields: dict, param: str) -> None:
    request = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}
    )
    with pytest.raises(RequestError, match=f"at most {MAX_GUIDE_CHARS}") as raised:
        output_constraint(request)
    assert raised.value.param == param and raised.value.status == 400


def test_tools_making_a_guide_over_the_limit_name_the_tools() -> None:
    big = {"type": "object", "properties": {"a": {"enum": ["x" * MAX_GUIDE_CHARS]}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": big}}]
    request = ChatCompletionRequest.model_validate(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": tools,
            "tool_choice": "required",
        }
    )
    with pytest.raises(RequestError, match=f"at most {MAX_GUIDE_CHARS}") as raised:
        plan_tools(request, None, True)
    assert raised.value.param == "tools"


def test_unknown_field_names_are_logged_once_escaped_and_bounded(caplog) -> None:
    caplog.set_level(logging.WARNING)
    log = UnknownFieldLog(max_names=3, max_chars=16)
    log.note("/v1/chat/completions", ["temprature", "tools[0].x", "tools[5].x"])
    log.note("/v1/chat/completions", ["temprature", "evil\nINFO forged line" + "y" * 10_000])
    log.note("/v1/completions", ["more", "and more"])  # beyond max_names: not remembered
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2
    assert "temprature, tools[].x" in messages[0]
    assert "\n" not in messages[1] and "evil\\nINFO forged..." in messages[1]
    assert len(messages[1]) < 200


def test_the_chat_templates_errors_are_told_apart(tokenizer) -> None:
    generator = Generator(TritonLLMClient.__new__(TritonLLMClient), tokenizer, LIMITS)
    serving = ChatCore(generator, MODEL)

    def request(**fields) -> ChatCompletionRequest:
        return ChatCompletionRequest.model_validate({"model": MODEL, **fields})

    # the client's: the template refuses the conversation (jinja2's raise_exception)
    tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    try:
        with pytest.raises(RequestError, match="roles must alternate") as raised:
            serving.render(request(messages=[{"role": "user", "content": "hi"}]))
        assert raised.value.status == 400 and raised.value.param == "messages"
        # the server's: a template that does not parse, or breaks on its own
        import jinja2

        tokenizer.chat_template = "{% for %}"
        with pytest.raises(jinja2.TemplateSyntaxError):
            serving.render(request(messages=[{"role": "user", "content": "hi"}]))
        tokenizer.chat_template = "{{ messages[0]['content'] + 1 }}"
        with pytest.raises(TypeError):
            serving.render(request(messages=[{"role": "user", "content": "hi"}]))
    finally:
        tokenizer.chat_template = CHAT_TEMPLATE
    # the client's: a content part that is not text
    image = [{"type": "image_url", "image_url": {"url": "x"}}]
    with pytest.raises(RequestError, match="not supported") as raised:
        serving.render(request(messages=[{"role": "user", "content": image}]))
    assert raised.value.status == 400


STRICT_BODIES = [
    b'{"model": "m", "prompt": "hi", "temperature": 1}',
    b'{"model": "m", "prompt": "hi", "temperature": "0.5"}',
    b'{"model": "m", "prompt": "hi", "temperature": true}',
    b'{"model": "m", "prompt": "hi", "temperature": NaN}',
    b'{"model": "m", "prompt": "hi", "max_tokens": 1.0}',
    b'{"model": "m", "prompt": "hi", "max_tokens": "10"}',
    b'{"model": "m", "prompt": "hi", "stream": 1}',
    b'{"model": "m", "prompt": "hi", "stream": "yes"}',
    b'{"model": "m", "prompt": "hi", "seed": 18446744073709551616}',
    b'{"model": "m", "prompt": "hi", "n": 1, "n": 2}',
    b'{"model": "m", "prompt": ["a", "b"]}',
    b'{"model": "m", "prompt": "hi", "stop": [1]}',
    b'{"model": "m", "prompt": "hi", "logprobs": true}',
    b'{"model": "m", "prompt": "hi", "stream_options": {"include_usage": "yes"}}',
    b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}',
    b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}',
    b'{"model": "m", "messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "always"}',
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": '
    b'{"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}}',
]


@pytest.mark.parametrize("body", STRICT_BODIES)
def test_parsing_then_validating_is_as_strict_as_validating_json(body: bytes) -> None:
    """routes._validate parses the body and then validates it (to hold the GIL in shorter
    stretches): the same requests pass, and the same fields fail, as with
    model_validate_json."""
    from pydantic import ValidationError

    from tensorrtllm_backend.serving.openai_api.protocol import CompletionRequest
    from tensorrtllm_backend.serving.web.endpoints import validate_body as _validate

    model = ChatCompletionRequest if b"messages" in body else CompletionRequest

    def outcome(validate) -> tuple:  # type: ignore[no-untyped-def]
        try:
            return ("ok", validate().model_dump())
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            return ("refused", first["type"], first["loc"])

    assert outcome(lambda: _validate(body, model)[0]) == outcome(
        lambda: model.model_validate_json(body)
    )


@pytest.mark.parametrize(
    ("body", "says"),
    [(b'{"model": "m", "prompt": ', "not valid JSON"), (b"[1, 2]", "must be a JSON object")],
)
def test_bodies_that_are_not_a_json_object(body: bytes, says: str) -> None:
    from tensorrtllm_backend.serving.openai_api.protocol import CompletionRequest
    from tensorrtllm_backend.serving.web.endpoints import validate_body as _validate

    with pytest.raises(RequestError, match=says) as raised:
        _validate(body, CompletionRequest)
    assert raised.value.status == 400
