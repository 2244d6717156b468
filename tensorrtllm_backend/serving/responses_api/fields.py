"""The field policy of OpenAI's Responses API as served here (:mod:`..field_policy`; rendered in
docs/api.md)."""

from __future__ import annotations

from .. import field_policy as rules

RESPONSES_FIELDS = rules.FieldTable(
    "Responses",
    [
        rules.SERVED_MODEL,
        rules.mapped(
            "input",
            "the conversation: messages, function calls and their outputs, "
            "reasoning items, custom tool calls, shell / local_shell / apply_patch calls and "
            "their outputs (the tool messages); system and developer messages join the system "
            "message; "
            "input_image parts with image_url for a model that takes images (file_id: a 400)",
            None,
        ),
        rules.mapped(
            "input[].output",
            "a function_call_output's (or custom_tool_call_output's) output: text, or input_text "
            "and input_image parts (for a model that takes images; its tool message holds them "
            "where they stand, counted as any image); input_file parts are refused",
            None,
        ),
        rules.mapped("instructions", "the system message, first", "Be brief."),
        rules.mapped("max_output_tokens", "max_tokens", 8),
        *rules.as_documented("temperature", "top_p"),
        rules.mapped(
            "tools",
            "function tools; a namespace tool's functions as `namespace__name`; custom tools "
            "as functions of one string `input`, called back as custom_tool_call items (a regex "
            "format enforced when forced); the built-ins the client runs (shell, local_shell, "
            "apply_patch) honoured as client-executed tools: each offered as a function of its "
            "action's shape, called back as shell_call / local_shell_call / apply_patch_call "
            "items; tools that run on OpenAI's side (a shell in OpenAI's container too) are left "
            "out (TRTLLM_HOSTED_TOOLS=omit) or refused (reject)",
            None,
        ),
        rules.mapped(
            "tool_choice",
            'as on chat completions: a guide for a forced call (also {"type": "shell"}, '
            '{"type": "apply_patch"})',
            None,
        ),
        rules.honoured("parallel_tool_calls", "", True),
        rules.mapped("text", "text.format: a guide (json_object, json_schema)", None),
        rules.accepted(
            "text.verbosity",
            "a hint of length to OpenAI's models; this model is not steered by it",
            None,
        ),
        *rules.as_documented("stream"),
        rules.accepted(
            "stream_options", "OpenAI's stream options change nothing in these events", {}
        ),
        rules.honoured(
            "store", "kept in the worker's memory (TRTLLM_RESPONSES_STORE_BYTES)", False
        ),
        rules.honoured("previous_response_id", "a stored response's conversation continues", None),
        rules.honoured(
            "include",
            '"reasoning.encrypted_content": reasoning items carry their thinking sealed '
            "(AES-GCM, TRTLLM_REASONING_KEY) for a stateless client to send back; other "
            "values are refused",
            ["reasoning.encrypted_content"],
        ),
        rules.mapped(
            "reasoning",
            "effort: the chat template's `reasoning_effort` variable and a thinking budget (as on chat completions); summary: "
            "the thinking, in the reasoning item's summary",
            {"effort": "low"},
        ),
        rules.honoured(
            "truncation",
            '"auto": the oldest turns are left out until the prompt fits max_input_len (system '
            'and developer messages stay); "disabled": a prompt too long is a 400',
            "auto",
        ),
        rules.refused("top_logprobs", "log probabilities are not returned on /v1/responses", 2),
        rules.refused(
            "max_tool_calls", "max_tool_calls is not supported: send tool_choice instead", 3
        ),
        rules.refused(
            "background",
            "background responses are not supported: send the request without "
            "background (stream it to see progress)",
            True,
        ),
        rules.refused(
            "conversation",
            "conversations are not supported: chain with previous_response_id",
            "conv_1",
        ),
        rules.refused(
            "prompt", "stored prompts are not supported: send instructions and input", {"id": "p"}
        ),
        rules.refused(
            "context_management",
            "context management (compaction) is not supported",
            [{"type": "compaction"}],
        ),
        *rules.bookkeeping("OpenAI", "metadata", "user", "service_tier", "safety_identifier"),
        rules.accepted("client_metadata", "Codex's session bookkeeping", {"session_id": "s"}),
        rules.accepted(
            "prompt_cache_key", "a routing hint: the engine reuses a prefix by itself", "k"
        ),
        rules.accepted("prompt_cache_retention", "the engine keeps its KV cache as it can", "24h"),
        *rules.as_documented(
            "seed",
            "top_k",
            "min_tokens",
            "repetition_penalty",
            "ignore_eos",
            "chat_template_kwargs",
            note="the chat API's extension",
        ),  # fmt: skip
    ],
)
