"""Guides for models that think first: the thinking runs free, the answer after it is guided.

A response_format, guided_* field or forced tool call constrains the answer. With a reasoning
model, the answer comes after the thinking block, so the guide becomes one EBNF grammar:

    root ::= thinking answer
    thinking ::= <any text without the end tag> "</think>" blank

where `answer` is the request's own guide turned into grammar rules by xgrammar (JSON schema,
regex, EBNF or structural tag) and `thinking` is required, optional or absent as the answer's
:class:`~.reasoning.Opening` says. The text without the end tag is spelled out as plain EBNF rules
(an automaton over the tag's characters, no builtin), so every xgrammar that TensorRT-LLM
ships compiles it: the guide travels as `ebnf_grammar` in the guide tensors, enforced by the CPU
engine and by TensorRT-LLM's xgrammar backend alike.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from ...common.guides import GuideError, check_guide_text
from ..schemas import GuidedDecoding
from .reasoning import Opening, ReasoningFormat

# What may separate the end tag from the answer: models write a blank line there, and a guided
# answer has no blank of its own to start with.
_BLANK = 'blank ::= "" | " " | "\\n" | "\\n\\n"'


def guide_after_reasoning(
    guided: GuidedDecoding, fmt: ReasoningFormat, opening: Opening
) -> GuidedDecoding:
    """The guide that enforces `guided` on the answer after the thinking (GuideError naming
    what does not compile). An answer that does not think keeps its guide as it is."""
    if opening is Opening.CONTENT:
        return guided
    check_guide_text(guided)
    grammar = _composed(guided.type, guided.guide or "", fmt.start, fmt.end, opening)
    return GuidedDecoding(type="ebnf_grammar", guide=grammar)


@lru_cache(maxsize=64)
def _composed(kind: str, guide: str, start: str, end: str, opening: Opening) -> str:
    import xgrammar

    try:
        answer = _answer_grammar(xgrammar, kind, guide)
    except (RuntimeError, ValueError, TypeError) as error:
        raise GuideError(f"guided_decoding {kind} guide does not compile: {error}") from None
    thinking = f"body {_literal(end)} blank"
    # Inside the block already (its start tag, if the model writes one, is thinking text too),
    # or thinking only if the answer opens a block.
    root = thinking if opening is Opening.REASONING else f'"" | {_literal(start)} {thinking}'
    prefix = xgrammar.Grammar.from_ebnf(
        "\n".join([f"root ::= {root}", *_text_without(end), _BLANK])
    )
    return str(xgrammar.Grammar.concat(prefix, answer))


def _answer_grammar(xgrammar: Any, kind: str, guide: str) -> Any:
    grammar = xgrammar.Grammar
    if kind == "json":
        return grammar.from_json_schema(guide or "{}", any_whitespace=False)
    if kind == "json_schema":
        return grammar.from_json_schema(guide, any_whitespace=False)
    if kind == "regex":
        return grammar.from_regex(guide)
    if kind == "ebnf_grammar":
        return grammar.from_ebnf(guide)
    return grammar.from_structural_tag(guide)


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _char_class(chars: set[str]) -> str:
    escaped = "".join("\\" + c if c in "]\\^-" else c for c in sorted(chars))
    return f"[^{escaped}]"


def _text_without(tag: str) -> list[str]:
    """EBNF rules `body` (state 0) .. of any text that does not contain `tag`.

    A state is how much of the tag the text ends with (Knuth-Morris-Pratt); a character that
    would complete the tag has no rule, so the tag can only be the end of the thinking.
    """
    names = ["body", *(f"body_{k}" for k in range(1, len(tag)))]
    rules = []
    for state in range(len(tag)):
        moves = {char: _advance(tag, state, char) for char in set(tag)}
        # Characters that start or extend a match, or would complete the tag, leave the class.
        special = {char for char, following in moves.items() if following}
        alternatives = ['""', f"{_char_class(special)} body"]
        alternatives += [
            f"{_literal(char)} {names[moves[char]]}"
            for char in sorted(special)
            if moves[char] < len(tag)
        ]
        rules.append(f"{names[state]} ::= {' | '.join(alternatives)}")
    return rules


def _advance(tag: str, state: int, char: str) -> int:
    """The state after `char`: the longest prefix of `tag` that the text then ends with."""
    matched = tag[:state] + char
    for size in range(min(len(matched), len(tag)), 0, -1):
        if matched.endswith(tag[:size]):
            return size
    return 0
