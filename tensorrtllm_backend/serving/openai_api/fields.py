"""The field policies of OpenAI's chat completions and completions, as served here
(:mod:`..field_policy`; rendered in docs/api.md)."""

from __future__ import annotations

from ..field_policy import FieldTable, Rule, accepted, honoured, mapped, refused

BOOKKEEPING = "bookkeeping for OpenAI's own service: nothing in it changes an answer"


def _sampling() -> list[Rule]:
    """The fields chat completions and completions share."""
    return [
        honoured("model", "the served model, or one of its LoRA adapters by name", "MODEL"),
        honoured("max_tokens", "", 8),
        honoured("max_completion_tokens", "", 8),
        honoured("temperature", "", 0.5),
        honoured("top_p", "", 0.9),
        honoured("presence_penalty", "", 0.1),
        honoured("frequency_penalty", "", 0.1),
        honoured("seed", "", 7),
        honoured("stop", "up to the native API's limit of stop strings", ["\n\n"]),
        honoured("n", "up to the native API's limit of sequences", 2),
        honoured("stream", "", False),
        honoured("stream_options", "`include_usage`, and vLLM's `continuous_usage_stats`", None),
        mapped(
            "response_format",
            "a guide (xgrammar): json_object, json_schema",
            {"type": "json_object"},
        ),
        accepted("store", "nothing is stored: the answer is the same", False),
        accepted("metadata", BOOKKEEPING, {"k": "v"}),
        accepted("user", BOOKKEEPING, "u1"),
        accepted("service_tier", BOOKKEEPING, "auto"),
        accepted("safety_identifier", BOOKKEEPING, "s1"),
        accepted("prompt_cache_key", "a routing hint: the engine reuses a prefix by itself", "k"),
        honoured("top_k", "TensorRT-LLM's and vLLM's extension", 5),
        honoured("min_tokens", "TensorRT-LLM's and vLLM's extension", 1),
        honoured("repetition_penalty", "TensorRT-LLM's and vLLM's extension", 1.1),
        honoured("ignore_eos", "TensorRT-LLM's and vLLM's extension", True),
        mapped("guided_json", "vLLM's extension: a guide", {"type": "object"}),
        mapped("guided_regex", "vLLM's extension: a guide", "[a-z]+"),
        mapped("guided_grammar", "vLLM's extension: a guide (EBNF)", 'root ::= "yes" | "no"'),
        mapped("guided_choice", "vLLM's extension: a guide", ["yes", "no"]),
        refused(
            "logit_bias",
            "logit_bias is not supported here (to keep words out of the "
            "answer, send bad_words to the native API)",
            {"42": 5},
        ),
        accepted(
            "prediction",
            "predicted outputs only speed OpenAI's answers up; the answer is the same without them",
            {"type": "content", "content": "x"},
        ),
        accepted(
            "verbosity",
            "a hint of length to OpenAI's models; this model is not steered by it (max_tokens is)",
            "low",
        ),
        refused(
            "web_search_options",
            "web search is not supported: this server runs the model only",
            {"search_context_size": "low"},
        ),
        refused(
            "audio",
            "audio output is not supported: this server generates text",
            {"voice": "alloy", "format": "wav"},
        ),
        refused(
            "modalities",
            'only text output is supported: send modalities ["text"] or none',
            ["text", "audio"],
        ),
    ]


CHAT_FIELDS = FieldTable(
    "chat completions",
    [
        honoured(
            "messages",
            "rendered by the model's chat template, tool calls and results "
            "included; content parts of type text",
            None,
        ),
        *_sampling(),
        honoured("logprobs", "", True),
        honoured("top_logprobs", "up to 20 (with logprobs)", None),
        honoured("tools", "function tools, shown to the chat template", None),
        mapped(
            "tool_choice",
            '"required" and a named function: a guide that makes a valid '
            'call; "auto": the model\'s own tool-call format, parsed',
            None,
        ),
        honoured("parallel_tool_calls", "false: a forced call is one call", True),
        honoured(
            "chat_template_kwargs",
            "the chat template's variables (vLLM's extension)",
            {"enable_thinking": False},
        ),
        honoured("add_generation_prompt", "vLLM's extension", True),
        honoured(
            "thinking_budget",
            "an extension: the thinking's tokens at most, its end marker then written for it (a "
            "model that thinks; not with a guide)",
            16,
        ),
        mapped(
            "reasoning_effort",
            "the chat template's `reasoning_effort` variable (a template without one ignores "
            "it), and a thinking budget: none 0, minimal 1/8, low 1/4, medium 1/2 of max_tokens",
            "low",
        ),
        refused(
            "functions",
            "functions is OpenAI's deprecated form of tools: send tools instead",
            [{"name": "f"}],
        ),
        refused(
            "function_call",
            "function_call is OpenAI's deprecated form of tool_choice: send tool_choice",
            "auto",
        ),
        refused(
            "best_of", "best_of is a /v1/completions field: ask for n sequences and pick one", 3
        ),
    ],
)

COMPLETIONS_FIELDS = FieldTable(
    "completions",
    [
        honoured("prompt", "one prompt, a string", None),
        *_sampling(),
        honoured(
            "echo",
            "the prompt before the answer; with logprobs it is refused: the prompt tokens' log "
            "probs are not computed here, and an evaluation harness would read wrong numbers",
            True,
        ),
        honoured("logprobs", "up to 5 alternatives, in the legacy shape", 1),
        honoured("best_of", "the n most likely of best_of sequences (not streamed)", None),
        refused("suffix", "suffix is not supported", "end"),
    ],
)
