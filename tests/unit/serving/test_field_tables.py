"""Every API's field table against its request models and docs/api.md: every field a model
declares is in its table, every refusal the validation answers is the table's, every example in
a table is a request the model takes, and the page shows the tables as they are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tensorrtllm_backend.serving.anthropic_api.protocol import MessagesRequest
from tensorrtllm_backend.serving.field_policy import FieldTable, Policy, Rule
from tensorrtllm_backend.serving.field_tables import TABLES, rendered
from tensorrtllm_backend.serving.openai_api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)
from tensorrtllm_backend.serving.responses_api.protocol import ResponsesRequest

API_DOC = Path(__file__).parents[3] / "docs" / "api.md"
MESSAGES = [{"role": "user", "content": "hi"}]
# Per table: its request model, and the smallest request it takes.
MODELS: dict[str, tuple[type[BaseModel], dict[str, Any]]] = {
    "chat": (ChatCompletionRequest, {"model": "m", "messages": MESSAGES}),
    "completions": (CompletionRequest, {"model": "m", "prompt": "hi"}),
    "responses": (ResponsesRequest, {"model": "m", "input": "hi"}),
    "messages": (MessagesRequest, {"model": "m", "max_tokens": 8, "messages": MESSAGES}),
}


def top_level(table: FieldTable) -> list[Rule]:
    return [rule for rule in table.rules if "." not in rule.name and "[" not in rule.name]


def with_example(name: str, rule: Rule) -> BaseModel:
    model, base = MODELS[name]
    example = "m" if rule.example == "MODEL" else rule.example
    return model.model_validate({**base, rule.name: example})


def test_the_docs_show_the_tables_as_the_code_has_them() -> None:
    text = API_DOC.read_text(encoding="utf-8")
    assert all(f"<!-- field-table: {name} -->" in text for name in TABLES)
    assert rendered(text) == text, "run: python -m tensorrtllm_backend.serving.field_tables"


@pytest.mark.parametrize("name", list(MODELS))
def test_every_declared_field_is_in_its_table(name: str) -> None:
    model, _ = MODELS[name]
    assert sorted(set(model.model_fields) - {r.name for r in top_level(TABLES[name])}) == []


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        (name, rule)
        for name, table in TABLES.items()
        for rule in top_level(table)
        if rule.example is not None  # the others have tests of their own
    ],
    ids=lambda value: value if isinstance(value, str) else value.name,
)
def test_each_example_is_taken_or_refused_as_its_table_says(name: str, rule: Rule) -> None:
    request = with_example(name, rule)
    refused = request.unsupported()  # type: ignore[attr-defined]
    if rule.policy is Policy.REFUSED:
        assert refused == (rule.name, rule.note)
    else:
        assert refused is None
