"""Scripted backend: a stand-in model that plays a script through the model's real tool-call
format, so that agent clients (coding CLIs, agent frameworks) complete real tool loops on two
CPU cores with prompts of any length.

It reads the rendered conversation (the packed chat template's markers: ``<|user|>``,
``<|tool|>`` with ``<tool_response>``), and answers:

* the last message is a tool result: ``Tool result: <the result>``, so a client's final answer
  quotes what its tool printed;
* the last user message holds ``CALL <tool> <JSON arguments>`` (anywhere in it, the last one
  counts): that call, written as the template's ``<tool_call>{"name": ..., "arguments": ...}
  </tool_call>``; with ``THINK <text>`` before it on its line, a ``<think>`` block first;
* otherwise: ``Hello from the scripted model.``

The answer is encoded with the packed tokenizer and sent one token per step, then the end token.
No tensor work: the cost is decoding the prompt once per request (a 64k-token prompt takes tens
of milliseconds).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .request import GenRequest
from .scheduler import StepResult

USER, TOOL = "<|user|>\n", "<|tool|>\n"
TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
# A directive names a tool and gives its arguments as one JSON object (to the end of the line).
CALL = re.compile(r"(?:THINK (?P<think>[^\n]*?) )?CALL (?P<name>[A-Za-z0-9_.:-]+) (?P<args>\{.*\})")
GREETING = "Hello from the scripted model."


def scripted_answer(conversation: str, end_text: str) -> str:
    """The answer to a rendered conversation (`end_text`: the end-of-turn marker the template
    closes each message with)."""
    last_user, last_tool = conversation.rfind(USER), conversation.rfind(TOOL)
    if last_tool > last_user:
        turn = conversation[last_tool + len(TOOL) :]
        results = TOOL_RESPONSE.findall(turn)
        return "Tool result: " + "\n".join(result.strip() for result in results)
    if last_user < 0:
        return GREETING
    message = conversation[last_user + len(USER) :].split(end_text, 1)[0]
    found = None
    for line in message.splitlines():
        for match in CALL.finditer(line):
            found = match
    if found is None:
        return GREETING
    try:
        arguments: Any = json.loads(found["args"])
    except ValueError:
        return f"The arguments of {found['name']} are not JSON."
    call = json.dumps({"name": found["name"], "arguments": arguments})
    think = f"<think>{found['think']}</think>" if found["think"] else ""
    return f"{think}<tool_call>\n{call}\n</tool_call>"


class ScriptedBackend:
    """Scheduler backend playing :func:`scripted_answer`; delays through ttft_s / itl_s."""

    takes_images = False

    def __init__(
        self,
        *,
        tokenizer_dir: Path,
        vocab_size: int,
        eos_token_id: int,
        ttft_ms: float = 0.0,
        itl_ms: float = 0.0,
    ) -> None:
        from ...common.tokenization import load_tokenizer

        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.end_text = str(self.tokenizer.eos_token or "")
        self.ttft_s = ttft_ms / 1000.0
        self.itl_s = itl_ms / 1000.0

    def admit(self, req: GenRequest) -> None:
        for token in req.prompt:
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"token id {token} outside the vocabulary [0, {self.vocab_size})")
        conversation = self.tokenizer.decode(req.prompt, skip_special_tokens=False)
        answer = scripted_answer(conversation, self.end_text)
        ids = list(self.tokenizer.encode(answer, add_special_tokens=False))
        end = req.end_id if req.end_id is not None else self.eos_token_id
        req.backend_state = [*ids, end]

    def step(self, batch: list[GenRequest]) -> list[StepResult]:
        out: list[StepResult] = []
        for req in batch:
            script: list[int] = req.backend_state
            position = len(req.generated)
            token = script[position] if position < len(script) else script[-1]
            out.append((token, 0.0, ([token], [0.0]) if req.top_logprobs else None))
        return out

    def release(self, req: GenRequest) -> None:
        req.backend_state = None
