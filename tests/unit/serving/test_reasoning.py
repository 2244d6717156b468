"""Reasoning: where an answer's thinking starts (from the rendered prompt), its split from the
content however the text is cut into pieces, tool calls read from the content only, and guides
that let the thinking run free and enforce the answer after it (checked with xgrammar's own
matcher on strings)."""

from __future__ import annotations

import json

import pytest
from chat_deltas import Deltas
from xgrammar import Grammar
from xgrammar.testing import _is_grammar_accept_string

from tensorrtllm_backend.common.guides import GuideError
from tensorrtllm_backend.serving.chat.answer import (
    Answer,
    ChatPlan,
    ReasoningPlan,
)
from tensorrtllm_backend.serving.chat.core import ChatCore
from tensorrtllm_backend.serving.chat.reasoning import (
    REASONING_FORMATS,
    Opening,
    ReasoningDelta,
    detect_reasoning,
    reasoning_format,
)
from tensorrtllm_backend.serving.chat.reasoning_guides import guide_after_reasoning
from tensorrtllm_backend.serving.chat.tool_parsers import FORMATS
from tensorrtllm_backend.serving.chat.tools import ToolPlan
from tensorrtllm_backend.serving.generation import EngineLimits, Generator
from tensorrtllm_backend.serving.openai_api.protocol import ChatCompletionRequest
from tensorrtllm_backend.serving.schemas import GuidedDecoding
from tensorrtllm_backend.triton.client import TritonLLMClient
from tests.thinking_model import MESSAGES, thinking_tokenizer

R1 = REASONING_FORMATS["deepseek_r1"]
QWEN3 = REASONING_FORMATS["qwen3"]
OK_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("fmt", "prompt", "opening"),
    [
        (QWEN3, "<|user|>\nhi\n<|assistant|>\n<think>\n", Opening.REASONING),
        (QWEN3, "<|assistant|>\n<think>\n\n</think>\n\n", Opening.CONTENT),
        (QWEN3, "<|assistant|>\n", Opening.DETECT),
        (R1, "<|assistant|>\n", Opening.REASONING),
        # An earlier turn's closed block does not open this answer.
        (QWEN3, "<think>a</think>b<|user|>\nhi<|assistant|>\n", Opening.DETECT),
    ],
)
def test_the_prompt_decides_how_the_answer_begins(fmt, prompt: str, opening: Opening) -> None:
    assert fmt.opening(prompt) is opening


def test_formats_are_recognised_by_their_chat_templates() -> None:
    qwen = "{% if enable_thinking is false %}<think>\n\n</think>{% endif %}"
    r1 = "{{ content.split('</think>')[-1] }}{% if add_generation_prompt %}<think>\n{% endif %}"
    assert detect_reasoning(qwen) is QWEN3
    assert detect_reasoning({"default": r1}) is R1
    assert detect_reasoning("{{ messages }}") is None
    assert reasoning_format("none", qwen) is None
    assert reasoning_format("deepseek_r1", None) is R1


def split(fmt, opening: Opening, text: str, step: int) -> tuple[str, str]:
    splitter = fmt.splitter(opening)
    events = []
    for start in range(0, len(text), step):
        events += splitter.feed(text[start : start + step])
    events += splitter.finish()
    thinking = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if not isinstance(e, ReasoningDelta))
    return thinking, content


@pytest.mark.parametrize("step", [1, 2, 3, 5, 1000])
@pytest.mark.parametrize(
    ("fmt", "opening", "text", "expected"),
    [
        (QWEN3, Opening.REASONING, "a < b </th x</think>\n\nAnswer.", ("a < b </th x", "Answer.")),
        (QWEN3, Opening.DETECT, "<think>plan</think>Done", ("plan", "Done")),
        (QWEN3, Opening.DETECT, "  <thin is not a tag", ("", "  <thin is not a tag")),
        (QWEN3, Opening.DETECT, "<thi", ("", "<thi")),
        (QWEN3, Opening.CONTENT, "<think>x</think>y", ("", "<think>x</think>y")),
        (R1, Opening.REASONING, "<think>\nplan</think>Done", ("plan", "Done")),
        (R1, Opening.REASONING, "never ends", ("never ends", "")),
        (R1, Opening.REASONING, "</think>only content", ("", "only content")),
    ],
)
def test_the_split_does_not_depend_on_the_pieces(fmt, opening, text, expected, step) -> None:
    assert split(fmt, opening, text, step) == expected


def test_calls_are_read_from_the_content_only() -> None:
    plan = ChatPlan(
        ToolPlan("auto", fmt=FORMATS["hermes"]), ReasoningPlan(QWEN3, Opening.REASONING)
    )
    text = (
        'maybe <tool_call>{"name": "a", "arguments": {}}</tool_call>?</think>Sure.'
        '<tool_call>{"name": "now", "arguments": {"tz": "UTC"}}</tool_call>'
    )
    answer = Answer.of(plan.reader().feed(text, final=True))
    assert answer.reasoning is not None and "<tool_call>" in answer.reasoning
    assert answer.content == "Sure."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in answer.tool_calls] == [
        ("now", {"tz": "UTC"})
    ]
    deltas = Deltas(plan.reader())
    pieces = [json.loads(d) for i in range(0, len(text), 4) for d in deltas.deltas(text[i : i + 4])]
    pieces += [json.loads(d) for d in deltas.deltas("", final=True)]
    assert "".join(p.get("reasoning", "") for p in pieces) == answer.reasoning
    assert all(p["reasoning"] == p["reasoning_content"] for p in pieces if "reasoning" in p)
    assert "".join(p.get("content", "") for p in pieces) == "Sure."
    assert deltas.calls == 1


def accepts(guide: GuidedDecoding, text: str) -> bool:
    assert guide.type == "ebnf_grammar" and guide.guide is not None
    return bool(_is_grammar_accept_string(Grammar.from_ebnf(guide.guide), text))


def schema_guide(schema: dict) -> GuidedDecoding:
    return GuidedDecoding(type="json_schema", guide=json.dumps(schema))


def test_thinking_runs_free_and_the_answer_follows_the_schema() -> None:
    guide = guide_after_reasoning(schema_guide(OK_SCHEMA), QWEN3, Opening.REASONING)
    # Thinking that no JSON grammar would allow, including pieces of the end tag.
    assert accepts(guide, 'Let me see: {oops] </thi <</think>\n\n{"ok": true}')
    assert accepts(guide, '</think>{"ok": false}')
    assert not accepts(guide, '{"ok": true}')  # the thinking must end first
    assert not accepts(guide, "hmm</think>The answer is yes.")
    assert not accepts(guide, 'hmm</think>{"ok": "yes"}')
    assert not accepts(guide, 'a</think></think>{"ok": true}')


def test_an_answer_that_may_think_may_also_answer_at_once() -> None:
    guide = guide_after_reasoning(schema_guide(OK_SCHEMA), QWEN3, Opening.DETECT)
    assert accepts(guide, '{"ok": true}')
    assert accepts(guide, '<think>x</think>{"ok": true}')
    assert not accepts(guide, 'x</think>{"ok": true}')


def test_other_guides_compose_too() -> None:
    regex = guide_after_reasoning(
        GuidedDecoding(type="regex", guide="[a-c]+"), R1, Opening.REASONING
    )
    assert accepts(regex, "think</think> abc") and not accepts(regex, "think</think>abd")
    grammar = GuidedDecoding(type="ebnf_grammar", guide='root ::= "yes" | "no"')
    composed = guide_after_reasoning(grammar, R1, Opening.REASONING)
    assert accepts(composed, "</think>no") and not accepts(composed, "</think>maybe")


def test_an_answer_without_thinking_keeps_its_guide() -> None:
    guide = schema_guide(OK_SCHEMA)
    assert guide_after_reasoning(guide, QWEN3, Opening.CONTENT) is guide


def test_a_guide_that_does_not_compile_is_a_guide_error() -> None:
    with pytest.raises(GuideError, match="not a valid JSON Schema"):
        guide_after_reasoning(schema_guide({"type": "nope"}), QWEN3, Opening.REASONING)
    with pytest.raises(GuideError, match="does not compile"):
        bad = GuidedDecoding(type="ebnf_grammar", guide="root ::= undefined_rule")
        guide_after_reasoning(bad, QWEN3, Opening.REASONING)


async def test_the_guide_tensors_carry_the_composed_grammar() -> None:
    """What TensorRT-LLM receives: a chat request with a schema, prepared for a model whose
    template opens a think block, sends the composed EBNF in the contract's guide tensors."""
    client = TritonLLMClient("127.0.0.1:1")  # never called: preparing talks to no server
    serving = ChatCore(Generator(client, thinking_tokenizer(), EngineLimits(512, 1024)), "m")
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": MESSAGES,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "ok", "schema": OK_SCHEMA},
            },
        }
    )
    prepared, plan = await serving.prepare(request)
    assert plan.reasoning is not None and plan.reasoning.opening is Opening.REASONING
    tensors, _ = serving.generator._triton_inputs(prepared, False)
    assert tensors["guided_decoding_guide_type"].item() == b"ebnf_grammar"
    guide = GuidedDecoding(
        type="ebnf_grammar", guide=tensors["guided_decoding_guide"].item().decode()
    )
    assert accepts(guide, 'Let me {think]</think>{"ok": true}') and not accepts(
        guide, '{"ok": true}'
    )
    await client.close()
