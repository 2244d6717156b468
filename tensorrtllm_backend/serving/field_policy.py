"""Each API's field policy, written down as data.

For every request field an API defines (and the extensions it accepts), its table says one of:

* honoured: the field does what the API documents;
* mapped: it is served through something else here (the note says what);
* accepted: accepted without effect, and the note says why that is harmless (bookkeeping, hints,
  features that only Anthropic's or OpenAI's own servers have and that change no answer);
* refused: it would change the answer in a way this server cannot honour: a 400 whose message is
  the note (what to send instead).

The validation code takes its refusals from the table (:meth:`FieldTable.refusal`), the docs
render it (docs/api.md, :meth:`FieldTable.markdown`), and a test walks every table against the
request models. Fields no table names are accepted and logged once (:mod:`.web.endpoints`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


class Policy(str, enum.Enum):
    HONOURED = "honoured"
    MAPPED = "mapped"
    ACCEPTED = "accepted without effect"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Rule:
    """One field: `name` is dotted, `[]` marks the items of a list (`tools[].cache_control`).
    `example`: a value a request may send for a top-level field (the tests send each one)."""

    name: str
    policy: Policy
    note: str = ""
    example: Any = None


def honoured(name: str, note: str = "", example: Any = None) -> Rule:
    return Rule(name, Policy.HONOURED, note, example)


def mapped(name: str, note: str, example: Any = None) -> Rule:
    return Rule(name, Policy.MAPPED, note, example)


def accepted(name: str, note: str, example: Any = None) -> Rule:
    return Rule(name, Policy.ACCEPTED, note, example)


def refused(name: str, note: str, example: Any = None) -> Rule:
    return Rule(name, Policy.REFUSED, note, example)


# Values the tests send for fields many APIs share (what a client would).
EXAMPLES: dict[str, Any] = {
    "model": "MODEL", "temperature": 0.5, "top_p": 0.9, "top_k": 5, "seed": 7, "stream": False,
    "min_tokens": 1, "repetition_penalty": 1.1, "ignore_eos": True,
    "chat_template_kwargs": {"enable_thinking": False}, "metadata": {"k": "v"}, "user": "u1",
    "service_tier": "auto", "safety_identifier": "s1",
}  # fmt: skip
SERVED_MODEL = honoured("model", "the served model, or one of its LoRA adapters by name", "MODEL")


def as_documented(*names: str, note: str = "") -> list[Rule]:
    """Fields honoured as their API documents them (`note`: what they are here, if anything)."""
    return [honoured(name, note, EXAMPLES.get(name)) for name in names]


def bookkeeping(owner: str, *names: str) -> list[Rule]:
    """Fields of bookkeeping for the API owner's own service."""
    note = f"bookkeeping for {owner}'s own service: nothing in it changes an answer"
    return [accepted(name, note, EXAMPLES.get(name)) for name in names]


class FieldTable:
    """The policy of one API's request fields."""

    def __init__(self, api: str, rules: Iterable[Rule]) -> None:
        self.api = api
        self.rules = list(rules)
        self._by_name = {rule.name: rule for rule in self.rules}
        if len(self._by_name) != len(self.rules):
            raise ValueError(f"{api}: a field is listed twice")
        for rule in self.rules:
            if rule.policy is not Policy.HONOURED and not rule.note:
                raise ValueError(f"{api}: {rule.name} is {rule.policy.value} and says not why")

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def rule(self, name: str) -> Rule:
        return self._by_name[name]

    def refusal(self, name: str) -> tuple[str, str]:
        """The 400 of a refused field: (the field, what to do instead)."""
        rule = self._by_name[name]
        if rule.policy is not Policy.REFUSED:
            raise ValueError(f"{self.api}: {name} is {rule.policy.value}, not refused")
        return name, rule.note

    def first_refused(
        self, request: BaseModel, neutral: dict[str, object] | None = None
    ) -> tuple[str, str] | None:
        """The first refused top-level field the request was sent, declared or not, whose value
        is set: None, false, empty and a field's `neutral` value are as good as absent."""
        sent = {
            **(request.model_extra or {}),
            **{name: getattr(request, name) for name in type(request).model_fields},
        }
        for rule in self.rules:
            if rule.policy is not Policy.REFUSED or "." in rule.name or "[" in rule.name:
                continue
            value = sent.get(rule.name)
            if value in (None, False, "", [], {}) or (neutral or {}).get(rule.name) == value:
                continue
            return rule.name, rule.note
        return None

    def markdown(self) -> str:
        """The table as docs/api.md shows it."""
        lines = ["| field | policy | how, or why |", "|---|---|---|"]
        for rule in self.rules:
            note = rule.note.replace("|", "\\|")
            lines.append(f"| `{rule.name}` | {rule.policy.value} | {note} |")
        return "\n".join(lines)
