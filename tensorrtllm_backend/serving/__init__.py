"""The BentoML worker, API side.

- :mod:`.generation`: the one generation path (limits, Triton stream, decoding, stop strings);
  :mod:`.triton_paths`: the ways through Triton, one object each, that build a request's tensors
  and decode its responses.
- :mod:`.chat`: the chat core every chat-family API is built on (the chat request, its
  preparation, the one answer-event stream, usage accounting).
- one package per API, each its protocol plus a renderer over the core, none importing another:
  :mod:`.openai_api` (completions, chat completions, models), :mod:`.responses_api`,
  :mod:`.anthropic_api`, :mod:`.vllm_api` (/tokenize); the native API is `service.py` over
  :mod:`.generation` and :mod:`.schemas`.
- :mod:`.web`: the HTTP plumbing the APIs share; :mod:`.errors`, :mod:`.guard`, :mod:`.metrics`:
  errors in each API's style, request limits, metrics.

It reaches Triton only through the engine interface in :mod:`..common.engine_api`; :mod:`.runtime`
wires in the gRPC client and the supervised tritonserver from ``triton/``.
"""
