"""vLLM's own routes beside the OpenAI API, at the root: /tokenize, /detokenize and
/tokenizer_info."""
