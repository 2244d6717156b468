"""vLLM's own routes beside the OpenAI API, at the root: /health, /tokenize, /detokenize and
/tokenizer_info."""
