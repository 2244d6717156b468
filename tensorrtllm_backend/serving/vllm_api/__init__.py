"""vLLM's own routes beside the OpenAI API: /tokenize and /detokenize, at the root."""
