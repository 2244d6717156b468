"""`response_format` and vLLM's `guided_*` fields → the core request's output constraint.

OpenAI's `{"type": "json_object"}` is a `json_schema` guide of any JSON object (TensorRT-LLM's
guide type `json` would admit any JSON value, e.g. a bare `false`); `{"type": "json_schema", ...}`
is `json_schema`; `guided_regex` is `regex`; `guided_grammar`
is `ebnf_grammar` (xgrammar's EBNF); `guided_choice` is an EBNF grammar of its strings. A request
may carry one constraint: two are a 400, since the engine applies a single guide.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..request_errors import RequestError
from ..schemas import MAX_GUIDE_CHARS, GuidedDecoding
from .request import ResponseFormat, SamplingFields

# Any JSON object. additionalProperties is spelled out: xgrammar's strict mode (TensorRT-LLM's
# too) reads a schema without it as "no properties but those listed".
ANY_OBJECT = json.dumps({"type": "object", "additionalProperties": True})


def make_guide(kind: str, text: str, param: str) -> GuidedDecoding:
    """The core request's guide; one longer than the engine takes is a 400 naming `param`."""
    if len(text) > MAX_GUIDE_CHARS:
        raise RequestError(
            f"{param} makes a guide of {len(text)} characters; at most {MAX_GUIDE_CHARS} are "
            "accepted: send a smaller one",
            param=param,
        )
    return GuidedDecoding(type=kind, guide=text)  # type: ignore[arg-type]


@dataclass(frozen=True)
class OutputConstraint:
    guide: GuidedDecoding
    param: str  # the request field it came from, for error messages


def output_constraint(request: SamplingFields) -> OutputConstraint | None:
    """The guide a request's response_format or guided_* field asks for (None: free text)."""
    found: list[OutputConstraint] = []
    if request.response_format is not None:
        guide = _from_response_format(request.response_format)
        if guide is not None:
            found.append(OutputConstraint(guide, "response_format"))
    if request.guided_json is not None:
        found.append(OutputConstraint(_schema_guide(request.guided_json), "guided_json"))
    if request.guided_regex is not None:
        regex = _guide("regex", request.guided_regex, "guided_regex")
        found.append(OutputConstraint(regex, "guided_regex"))
    if request.guided_grammar is not None:
        grammar = _guide("ebnf_grammar", request.guided_grammar, "guided_grammar")
        found.append(OutputConstraint(grammar, "guided_grammar"))
    if request.guided_choice is not None:
        found.append(OutputConstraint(choice_guide(request.guided_choice), "guided_choice"))
    if len(found) > 1:
        names = ", ".join(c.param for c in found)
        raise RequestError(
            f"send one output constraint per request, not several ({names})", param=found[1].param
        )
    return found[0] if found else None


def _from_response_format(response_format: ResponseFormat) -> GuidedDecoding | None:
    if response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return GuidedDecoding(type="json_schema", guide=ANY_OBJECT)
    spec = response_format.json_schema
    assert spec is not None  # checked by ResponseFormat
    if spec.json_schema is None:  # OpenAI's schema is optional: then any JSON object
        return GuidedDecoding(type="json_schema", guide=ANY_OBJECT)
    return make_guide("json_schema", json.dumps(spec.json_schema), "response_format")


def _schema_guide(schema: dict[str, object] | str) -> GuidedDecoding:
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except ValueError as error:
            raise RequestError(
                f"guided_json is not valid JSON: {error}", param="guided_json"
            ) from None
        if not isinstance(parsed, dict):
            raise RequestError("guided_json must be a JSON schema object", param="guided_json")
        schema = parsed
    return make_guide("json_schema", json.dumps(schema), "guided_json")


def _guide(kind: str, text: str, param: str) -> GuidedDecoding:
    if not text.strip():
        raise RequestError(f"the {kind} guide is empty", param=param)
    return make_guide(kind, text, param)


def choice_guide(choices: list[str]) -> GuidedDecoding:
    """An EBNF grammar whose sentences are exactly the given strings."""
    if any(not choice for choice in choices):
        raise RequestError("guided_choice strings must not be empty", param="guided_choice")
    alternatives = " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)
    return make_guide("ebnf_grammar", f"root ::= {alternatives}", "guided_choice")
