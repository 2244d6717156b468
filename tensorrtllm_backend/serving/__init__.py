"""The BentoML worker, API side: request schemas, the one generation path every API shares
(:mod:`.generation`), the route objects that speak each Triton model's tensors (:mod:`.routes`),
the native and OpenAI adapters, errors, request limits and metrics.

It reaches Triton only through the engine interface in :mod:`..common.engine_api`; :mod:`.runtime`
wires in the gRPC client and the supervised tritonserver from ``triton/``.
"""
