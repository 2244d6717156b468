"""The field policy of Anthropic's Messages API as served here (:mod:`..field_policy`;
rendered in docs/api.md)."""

from __future__ import annotations

from ..field_policy import FieldTable, accepted, honoured, mapped, refused

MESSAGES_FIELDS = FieldTable(
    "Messages",
    [
        honoured("model", "the served model, or one of its LoRA adapters by name", "MODEL"),
        mapped(
            "messages",
            "text, tool_use, tool_result and thinking blocks; system messages "
            "join the system message",
            None,
        ),
        mapped("system", "the system message, first", "Be brief."),
        mapped("max_tokens", "max_tokens", 8),
        honoured("stop_sequences", "", ["\n\n"]),
        honoured("temperature", "", 0.5),
        honoured("top_p", "", 0.9),
        honoured("top_k", "", 5),
        honoured("stream", "", False),
        mapped("tools", "client tools with their input_schema; server tools are refused", None),
        honoured(
            "tools[].defer_loading",
            "left out of the prompt until a tool_reference block loads it",
            None,
        ),
        accepted(
            "tools[].input_examples",
            "examples for Anthropic's models; the chat template shows the schema",
            None,
        ),
        mapped("tool_choice", '"any" and "tool": a guide that makes a valid call', None),
        mapped(
            "thinking",
            "adaptive: the template's default; disabled / enabled: its `enable_thinking`, and "
            "enabled's budget_tokens caps the thinking (enabled is refused on a model that "
            "does not think)",
            {"type": "adaptive"},
        ),
        mapped(
            "output_config",
            "format: a guide (JSON schema); effort: a thinking budget (as on chat completions) and the chat template's "
            "`reasoning_effort` variable",
            {"effort": "high"},
        ),
        honoured(
            "context_management",
            "clear_tool_uses and clear_thinking edits, applied before "
            "the prompt is rendered; applied_edits in the answer",
            {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        ),
        accepted(
            "cache_control",
            "(on blocks and tools) the engine reuses cached prefixes by itself, marked or not",
            None,
        ),
        accepted(
            "metadata", "bookkeeping (user_id): nothing in it changes an answer", {"user_id": "u1"}
        ),
        accepted("service_tier", "bookkeeping for Anthropic's own service", "auto"),
        refused(
            "container",
            "containers (code execution) are not supported: this server runs the model only",
            "c1",
        ),
        refused(
            "mcp_servers",
            "MCP servers are not supported: send the tools themselves",
            [{"type": "url", "url": "http://mcp.invalid", "name": "m"}],
        ),
    ],
)
