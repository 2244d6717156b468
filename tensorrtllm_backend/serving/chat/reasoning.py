"""Reasoning ("thinking") in generated text: the formats of the model families that think, and
the split of one answer into its reasoning and its content, piece by piece.

DeepSeek-R1, QwQ and Qwen3 write their thinking between ``<think>`` and ``</think>``, then the
answer. They differ in where the block opens:

* ``deepseek_r1`` (DeepSeek-R1, QwQ): the chat template's generation prompt opens the block (or
  the model starts thinking without writing the tag): everything before ``</think>`` is reasoning;
* ``qwen3``: the model writes ``<think>`` itself when it thinks, and its template closes an empty
  block in the prompt when ``enable_thinking`` is false; text that does not open with the tag is
  content.

Whatever the family, the rendered prompt decides first (:meth:`ReasoningFormat.opening`): a prompt
that ends inside an open block starts the answer in reasoning, one that closed the block starts it
in content. The answer's guide follows the same decision
(:mod:`.reasoning_guides`), so what the parser calls reasoning is exactly what the grammar let
run free.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .events import ContentDelta, ReasoningDelta


class Opening(str, enum.Enum):
    """How an answer begins, as far as reasoning goes."""

    REASONING = "reasoning"  # inside a thinking block: reasoning until the end tag
    CONTENT = "content"  # no thinking (the prompt closed the block)
    DETECT = "detect"  # reasoning only if the answer opens a block itself


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    """How one model family marks its thinking."""

    name: str
    start: str = "<think>"
    end: str = "</think>"
    # Text that does not open with `start` is still reasoning until `end` (DeepSeek-R1).
    implicit_start: bool = False

    def opening(self, prompt: str) -> Opening:
        """How an answer to `prompt` (the rendered chat) begins."""
        start, end = prompt.rfind(self.start), prompt.rfind(self.end)
        if start > end:
            return Opening.REASONING
        if end != -1 and prompt.rstrip().endswith(self.end):
            return Opening.CONTENT
        return Opening.REASONING if self.implicit_start else Opening.DETECT

    def splitter(self, opening: Opening) -> ReasoningSplitter:
        return ReasoningSplitter(self, opening)


REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "deepseek_r1": ReasoningFormat("deepseek_r1", implicit_start=True),
    "qwen3": ReasoningFormat("qwen3"),
}


def detect_reasoning(chat_template: str | dict[str, str] | None) -> ReasoningFormat | None:
    """The reasoning format a chat template renders, recognised by its tags: Qwen3's templates
    take `enable_thinking`, the others that know `</think>` think like DeepSeek-R1."""
    if isinstance(chat_template, dict):
        chat_template = "\n".join(chat_template.values())
    if not chat_template or "</think>" not in chat_template:
        return None
    if "enable_thinking" in chat_template:
        return REASONING_FORMATS["qwen3"]
    return REASONING_FORMATS["deepseek_r1"]


def reasoning_format(
    name: str | None, chat_template: str | dict[str, str] | None
) -> ReasoningFormat | None:
    """The served model's format: by name (TRTLLM_REASONING_PARSER; "none": the model does not
    think), else read from its chat template."""
    if name is None:
        return detect_reasoning(chat_template)
    return None if name == "none" else REASONING_FORMATS[name]


class ReasoningSplitter:
    """Splits one generated sequence into reasoning and content, incrementally.

    Text that could still become a tag (``</thi``) is held back until it is known. The content
    after the end tag starts at its first non-blank character (models put a blank line there).
    """

    def __init__(self, fmt: ReasoningFormat, opening: Opening) -> None:
        self.fmt = fmt
        self._state = opening
        self._buffer = ""
        # Nothing of the thinking, or of the content after it, sent yet: both start at their
        # first non-blank character. An answer that does not think is sent as it is.
        self._leading = opening is not Opening.CONTENT

    @property
    def reasoning(self) -> bool:
        """Whether the text fed so far ends inside the thinking."""
        return self._state is Opening.REASONING

    def feed(self, text: str) -> list[ReasoningDelta | ContentDelta]:
        self._buffer += text
        return self._run(final=False)

    def finish(self) -> list[ReasoningDelta | ContentDelta]:
        """Events for the text held back when the sequence ended."""
        return self._run(final=True)

    def _run(self, final: bool) -> list[ReasoningDelta | ContentDelta]:
        events: list[ReasoningDelta | ContentDelta] = []
        while True:
            state, size = self._state, len(self._buffer)
            if state is Opening.DETECT:
                self._detect(final)
            elif state is Opening.REASONING:
                events += self._reasoning(final)
            else:
                events += self._content()
            if (self._state, len(self._buffer)) == (state, size):
                return events

    def _detect(self, final: bool) -> None:
        stripped = self._buffer.lstrip()
        if stripped.startswith(self.fmt.start):
            self._buffer = stripped[len(self.fmt.start) :]
            self._state, self._leading = Opening.REASONING, True
        elif final or (stripped and not self.fmt.start.startswith(stripped)):
            self._state, self._leading = Opening.CONTENT, False

    def _reasoning(self, final: bool) -> list[ReasoningDelta | ContentDelta]:
        buffer = self._buffer
        if self._leading:
            # Thinking starts at its first non-blank character, after an opening tag the model
            # wrote itself (the prompt may have opened the block already).
            buffer = buffer.lstrip()
            if buffer.startswith(self.fmt.start):
                buffer = buffer[len(self.fmt.start) :].lstrip()
            elif self.fmt.start.startswith(buffer) and not final:
                self._buffer = buffer
                return []  # blank, or a partial opening tag
        at = buffer.find(self.fmt.end)
        if at != -1:
            self._buffer = buffer[at + len(self.fmt.end) :]
            self._state, self._leading = Opening.CONTENT, True
            return [ReasoningDelta(buffer[:at])] if at else []
        cut = len(buffer) if final else len(buffer) - _partial_suffix(buffer, self.fmt.end)
        self._buffer = buffer[cut:]
        if not cut:
            return []
        self._leading = False
        return [ReasoningDelta(buffer[:cut])]

    def _content(self) -> list[ReasoningDelta | ContentDelta]:
        text, self._buffer = self._buffer, ""
        if self._leading:
            text = text.lstrip()
        if not text:
            return []
        self._leading = False
        return [ContentDelta(text)]


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could begin `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
