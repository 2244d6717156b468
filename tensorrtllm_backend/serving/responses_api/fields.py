"""The field policy of OpenAI's Responses API as served here (:mod:`..field_policy`; rendered in
docs/api.md)."""

from __future__ import annotations

from ..field_policy import FieldTable, accepted, honoured, mapped, refused

BOOKKEEPING = "bookkeeping for OpenAI's own service: nothing in it changes an answer"

RESPONSES_FIELDS = FieldTable(
    "Responses",
    [
        honoured("model", "the served model, or one of its LoRA adapters by name", "MODEL"),
        mapped(
            "input",
            "the conversation: messages, function calls and their outputs, "
            "reasoning items; system and developer messages join the system message",
            None,
        ),
        mapped("instructions", "the system message, first", "Be brief."),
        mapped("max_output_tokens", "max_tokens", 8),
        honoured("temperature", "", 0.5),
        honoured("top_p", "", 0.9),
        mapped(
            "tools",
            "function tools; a namespace tool's functions as `namespace__name`; tools "
            "that run on OpenAI's side are left out (TRTLLM_HOSTED_TOOLS=omit) or refused "
            "(reject)",
            None,
        ),
        mapped("tool_choice", "as on chat completions: a guide for a forced call", None),
        honoured("parallel_tool_calls", "", True),
        mapped("text", "text.format: a guide (json_object, json_schema)", None),
        accepted(
            "text.verbosity",
            "a hint of length to OpenAI's models; this model is not steered by it",
            None,
        ),
        honoured("stream", "", False),
        accepted("stream_options", "OpenAI's stream options change nothing in these events", {}),
        honoured("store", "kept in the worker's memory (TRTLLM_RESPONSES_STORE_BYTES)", False),
        honoured("previous_response_id", "a stored response's conversation continues", None),
        honoured(
            "include",
            '"reasoning.encrypted_content": reasoning items carry their thinking sealed '
            "(AES-GCM, TRTLLM_REASONING_KEY) for a stateless client to send back; other "
            "values are refused",
            ["reasoning.encrypted_content"],
        ),
        mapped(
            "reasoning",
            "effort: the chat template's `reasoning_effort` variable and a thinking budget (as on chat completions); summary: "
            "the thinking, in the reasoning item's summary",
            {"effort": "low"},
        ),
        honoured(
            "truncation",
            '"auto": the oldest turns are left out until the prompt fits max_input_len (system '
            'and developer messages stay); "disabled": a prompt too long is a 400',
            "auto",
        ),
        refused("top_logprobs", "log probabilities are not returned on /v1/responses", 2),
        refused("max_tool_calls", "max_tool_calls is not supported: send tool_choice instead", 3),
        refused(
            "background",
            "background responses are not supported: send the request without "
            "background (stream it to see progress)",
            True,
        ),
        refused(
            "conversation",
            "conversations are not supported: chain with previous_response_id",
            "conv_1",
        ),
        refused(
            "prompt", "stored prompts are not supported: send instructions and input", {"id": "p"}
        ),
        refused(
            "context_management",
            "context management (compaction) is not supported",
            [{"type": "compaction"}],
        ),
        accepted("metadata", BOOKKEEPING, {"k": "v"}),
        accepted("user", BOOKKEEPING, "u1"),
        accepted("service_tier", BOOKKEEPING, "auto"),
        accepted("safety_identifier", BOOKKEEPING, "s1"),
        accepted("client_metadata", "Codex's session bookkeeping", {"session_id": "s"}),
        accepted("prompt_cache_key", "a routing hint: the engine reuses a prefix by itself", "k"),
        accepted("prompt_cache_retention", "the engine keeps its KV cache as it can", "24h"),
        honoured("seed", "the chat API's extension", 7),
        honoured("top_k", "the chat API's extension", 5),
        honoured("min_tokens", "the chat API's extension", 1),
        honoured("repetition_penalty", "the chat API's extension", 1.1),
        honoured("ignore_eos", "the chat API's extension", True),
        honoured("chat_template_kwargs", "the chat API's extension", {"enable_thinking": False}),
    ],
)
