"""The field policies of OpenAI's chat completions and completions, as served here
(:mod:`..field_policy`; rendered in docs/api.md)."""

from __future__ import annotations

from .. import field_policy as rules


def _sampling() -> list[rules.Rule]:
    """The fields chat completions and completions share."""
    return [
        rules.SERVED_MODEL,
        rules.honoured("max_tokens", "", 8),
        rules.honoured("max_completion_tokens", "", 8),
        *rules.as_documented("temperature", "top_p"),
        rules.honoured("presence_penalty", "", 0.1),
        rules.honoured("frequency_penalty", "", 0.1),
        *rules.as_documented("seed"),
        rules.honoured("stop", "up to the native API's limit of stop strings", ["\n\n"]),
        rules.honoured("n", "up to the native API's limit of sequences", 2),
        *rules.as_documented("stream"),
        rules.honoured(
            "stream_options", "`include_usage`, and vLLM's `continuous_usage_stats`", None
        ),
        rules.mapped(
            "response_format",
            "a guide (xgrammar): json_object, json_schema",
            {"type": "json_object"},
        ),
        rules.accepted("store", "nothing is stored: the answer is the same", False),
        *rules.bookkeeping("OpenAI", "metadata", "user", "service_tier", "safety_identifier"),
        rules.accepted(
            "prompt_cache_key", "a routing hint: the engine reuses a prefix by itself", "k"
        ),
        *rules.as_documented(
            "top_k",
            "min_tokens",
            "repetition_penalty",
            "ignore_eos",
            note="TensorRT-LLM's and vLLM's extension",
        ),  # fmt: skip
        rules.mapped("guided_json", "vLLM's extension: a guide", {"type": "object"}),
        rules.mapped("guided_regex", "vLLM's extension: a guide", "[a-z]+"),
        rules.mapped("guided_grammar", "vLLM's extension: a guide (EBNF)", 'root ::= "yes" | "no"'),
        rules.mapped("guided_choice", "vLLM's extension: a guide", ["yes", "no"]),
        rules.refused(
            "logit_bias",
            "logit_bias is not supported here (to keep words out of the "
            "answer, send bad_words to the native API)",
            {"42": 5},
        ),
        rules.accepted(
            "prediction",
            "predicted outputs only speed OpenAI's answers up; the answer is the same without them",
            {"type": "content", "content": "x"},
        ),
        rules.accepted(
            "verbosity",
            "a hint of length to OpenAI's models; this model is not steered by it (max_tokens is)",
            "low",
        ),
        rules.refused(
            "web_search_options",
            "web search is not supported: this server runs the model only",
            {"search_context_size": "low"},
        ),
        rules.refused(
            "audio",
            "audio output is not supported: this server generates text",
            {"voice": "alloy", "format": "wav"},
        ),
        rules.refused(
            "modalities",
            'only text output is supported: send modalities ["text"] or none',
            ["text", "audio"],
        ),
    ]


CHAT_FIELDS = rules.FieldTable(
    "chat completions",
    [
        rules.honoured(
            "messages",
            "rendered by the model's chat template, tool calls and results "
            "included; content parts of type text, and image_url (a data: URI, or an http(s) "
            "URL of TRTLLM_ALLOWED_MEDIA_DOMAINS' hosts; `detail` accepted, the size is the "
            "model processor's) for a model that takes images",
            None,
        ),
        *_sampling(),
        rules.honoured("logprobs", "", True),
        rules.honoured("top_logprobs", "up to 20 (with logprobs)", None),
        rules.honoured(
            "prompt_logprobs",
            "vLLM's: the rendered prompt's token log probs, ranks and up to 20 alternatives "
            "(not streamed)",
            1,
        ),
        rules.honoured("tools", "function tools, shown to the chat template", None),
        rules.mapped(
            "tool_choice",
            '"required" and a named function: a guide that makes a valid '
            'call; "auto": the model\'s own tool-call format, parsed',
            None,
        ),
        rules.honoured("parallel_tool_calls", "false: a forced call is one call", True),
        rules.honoured(
            "chat_template_kwargs",
            "the chat template's variables (vLLM's extension)",
            {"enable_thinking": False},
        ),
        rules.honoured("add_generation_prompt", "vLLM's extension", True),
        rules.honoured(
            "thinking_budget",
            "an extension: the thinking's tokens at most, its end marker then written for it (a "
            "model that thinks; not with a guide)",
            16,
        ),
        rules.mapped(
            "reasoning_effort",
            "the chat template's `reasoning_effort` variable (a template without one ignores "
            "it), and a thinking budget: none 0, minimal 1/8, low 1/4, medium 1/2 of max_tokens",
            "low",
        ),
        rules.refused(
            "functions",
            "functions is OpenAI's deprecated form of tools: send tools instead",
            [{"name": "f"}],
        ),
        rules.refused(
            "function_call",
            "function_call is OpenAI's deprecated form of tool_choice: send tool_choice",
            "auto",
        ),
        rules.refused(
            "best_of", "best_of is a /v1/completions field: ask for n sequences and pick one", 3
        ),
    ],
)

COMPLETIONS_FIELDS = rules.FieldTable(
    "completions",
    [
        rules.honoured(
            "prompt",
            "a string, strings, token ids or lists of token ids; a list is a batch of up to 256 "
            "prompts (choices prompt-major, then n); token ids on the direct and llmapi routes",
            None,
        ),
        *_sampling(),
        rules.honoured(
            "echo",
            "the prompt before the answer; with logprobs, the prompt tokens' log probs too (the "
            "first null), from the engine's context logits; max_tokens 0 scores only",
            True,
        ),
        rules.honoured("logprobs", "up to 5 alternatives, in the legacy shape", 1),
        rules.honoured(
            "prompt_logprobs",
            "vLLM's: each prompt token's log prob, rank and up to 20 alternatives, per choice "
            "(not streamed)",
            1,
        ),
        rules.honoured("best_of", "the n most likely of best_of sequences (not streamed)", None),
        rules.honoured(
            "add_special_tokens",
            "vLLM's: whether a text prompt gets the tokenizer's special tokens (default: "
            "TRTLLM_COMPLETIONS_ADD_SPECIAL_TOKENS, true)",
            True,
        ),
        rules.refused("suffix", "suffix is not supported", "end"),
    ],
)
