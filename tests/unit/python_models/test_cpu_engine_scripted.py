"""The scripted CPU engine: what it answers to a rendered conversation, and that the scheduler
sends that answer through the packed tokenizer, then ends on the end token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cpu_engine_helpers import make_request, run_to_end

from tensorrtllm_backend.packing.demo import CHAT_TEMPLATE
from tensorrtllm_backend.python_models.cpu_engine.request import FinishReason
from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler
from tensorrtllm_backend.python_models.cpu_engine.scripted import (
    GREETING,
    ScriptedBackend,
    scripted_answer,
)

BASH = {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}


def render(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    assert tokenizer.chat_template == CHAT_TEMPLATE
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )


def test_a_user_turn_with_a_directive_is_that_call(demo_tokenizer) -> None:
    ask = 'Please run it.\nCALL Bash {"command": "echo hi", "timeout": 5}\nthanks'
    prompt = render(demo_tokenizer, [{"role": "user", "content": ask}], [BASH])
    answer = scripted_answer(prompt, demo_tokenizer.eos_token)
    assert answer.startswith("<tool_call>\n") and answer.endswith("\n</tool_call>")
    call = json.loads(answer.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert call == {"name": "Bash", "arguments": {"command": "echo hi", "timeout": 5}}


def test_the_last_user_turn_decides(demo_tokenizer) -> None:
    messages = [
        {"role": "user", "content": 'CALL Bash {"command": "old"}'},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "no directive here"},
    ]
    assert scripted_answer(render(demo_tokenizer, messages), demo_tokenizer.eos_token) == GREETING
    think = 'THINK first look CALL Bash {"command": "ls"}'
    answer = scripted_answer(
        render(demo_tokenizer, [{"role": "user", "content": think}]), demo_tokenizer.eos_token
    )
    assert answer.startswith("<think>first look</think><tool_call>")


def test_a_tool_result_is_quoted(demo_tokenizer) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": 'CALL Bash {"command": "echo MARK-42"}'},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "MARK-42\n"},
    ]
    answer = scripted_answer(render(demo_tokenizer, messages, [BASH]), demo_tokenizer.eos_token)
    assert answer == "Tool result: MARK-42"


@pytest.mark.parametrize("ask", ["hello", 'CALL Bash {"command": "echo € ünïcode"}'])
def test_the_scheduler_sends_the_answer_then_the_end_token(
    demo_checkpoint: Path, demo_tokenizer, ask: str
) -> None:
    eos = demo_tokenizer.eos_token_id
    backend = ScriptedBackend(
        tokenizer_dir=demo_checkpoint, vocab_size=len(demo_tokenizer), eos_token_id=eos
    )
    scheduler = Scheduler(backend, 4)
    scheduler.start()
    try:
        prompt = demo_tokenizer.encode(
            render(demo_tokenizer, [{"role": "user", "content": ask}], [BASH]),
            add_special_tokens=False,
        )
        request, sink = make_request(prompt, 512, end_id=eos)
        (generated,) = run_to_end(scheduler, [(request, sink)])
    finally:
        scheduler.stop()
    assert sink.reason is FinishReason.END_ID
    text = demo_tokenizer.decode(generated)
    expected = scripted_answer(demo_tokenizer.decode(prompt), demo_tokenizer.eos_token)
    assert text == expected and (ask == "hello") == (text == GREETING)
