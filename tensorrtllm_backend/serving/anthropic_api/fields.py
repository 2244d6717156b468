"""The field policy of Anthropic's Messages API as served here (:mod:`..field_policy`;
rendered in docs/api.md)."""

from __future__ import annotations

from .. import field_policy as rules

MESSAGES_FIELDS = rules.FieldTable(
    "Messages",
    [
        rules.SERVED_MODEL,
        rules.mapped(
            "messages",
            "text, tool_use, tool_result and thinking blocks, and image blocks (base64, or a "
            "url of TRTLLM_ALLOWED_MEDIA_DOMAINS' hosts) for a model that takes images; "
            "system messages join the system message",
            None,
        ),
        rules.mapped(
            "messages[].content[].content",
            "a tool_result's content: text, image blocks (for a model that takes images; its "
            "tool message holds them where they stand, counted as any image) and tool_reference "
            "blocks; documents and other blocks are refused",
            None,
        ),
        rules.mapped("system", "the system message, first", "Be brief."),
        rules.mapped("max_tokens", "max_tokens", 8),
        rules.honoured("stop_sequences", "", ["\n\n"]),
        *rules.as_documented("temperature", "top_p", "top_k", "stream"),
        rules.mapped(
            "tools", "client tools with their input_schema; server tools are refused", None
        ),
        rules.honoured(
            "tools[].defer_loading",
            "left out of the prompt until a tool_reference block loads it",
            None,
        ),
        rules.accepted(
            "tools[].input_examples",
            "examples for Anthropic's models; the chat template shows the schema",
            None,
        ),
        rules.mapped("tool_choice", '"any" and "tool": a guide that makes a valid call', None),
        rules.mapped(
            "thinking",
            "adaptive: the template's default; disabled / enabled: its `enable_thinking`, and "
            "enabled's budget_tokens caps the thinking (enabled is refused on a model that "
            "does not think)",
            {"type": "adaptive"},
        ),
        rules.mapped(
            "output_config",
            "format: a guide (JSON schema); effort: a thinking budget (as on chat completions) and the chat template's "
            "`reasoning_effort` variable",
            {"effort": "high"},
        ),
        rules.honoured(
            "context_management",
            "clear_tool_uses and clear_thinking edits, applied before "
            "the prompt is rendered; applied_edits in the answer",
            {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        ),
        rules.accepted(
            "cache_control",
            "(on blocks and tools) the engine reuses cached prefixes by itself, marked or not",
            None,
        ),
        *rules.bookkeeping("Anthropic", "metadata", "service_tier"),
        rules.refused(
            "container",
            "containers (code execution) are not supported: this server runs the model only",
            "c1",
        ),
        rules.refused(
            "mcp_servers",
            "MCP servers are not supported: send the tools themselves",
            [{"type": "url", "url": "http://mcp.invalid", "name": "m"}],
        ),
    ],
)
