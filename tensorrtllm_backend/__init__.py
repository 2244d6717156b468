"""BentoML × TensorRT-LLM: everything behind `service.py` and `pack_model.py`.

The subpackages are grouped by the process that runs them:

- ``packing/``        pack time (`pack_model.py`, `python -m tensorrtllm_backend.packing.fill_template`):
                      engine / checkpoint inspection, template filling, the model-store writer.
- ``serving/``        the BentoML worker, API side: schemas, the one generation path, route
                      objects, the native and OpenAI adapters, errors, limits, metrics.
- ``triton/``         the BentoML worker, process side: finding and starting tritonserver,
                      supervising it, sharing it between workers, the gRPC client.
- ``python_models/``  inside Triton's python stubs: helpers of the pre/post-processing and BLS
                      models, the stub guard, and the CPU stand-in engine.
- ``common/``         small modules more than one layer imports (tokenization, guides, the
                      engine config reader, the engine interface, the CPU engine's directory
                      format, LoRA files).
- ``all_models/``     the Triton model-repository templates; their `model.py` files run in the
                      stubs.
- ``settings.py``     every `TRTLLM_*` variable, read in one place.

Each layer imports only itself and the layers :data:`ALLOWED_IMPORTS` names for it, so that code
running inside Triton's stubs never pulls in the worker's (tests/unit/test_layers.py checks it).
"""

import os

# grpcio reads GRPC_EXPERIMENTS once, when it loads, and the package's processes load it after
# this line. Its default client I/O (the EventEngine) costs a Python client ~40 % more CPU per
# streamed response than its older poller: twice the system time, and a write() on the event
# loop's thread for every read it starts (docs/streaming-path.md, "Receiving a token"). The service
# streams one response per token, so it takes the poller unless the environment chose otherwise.
os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_client")

ALLOWED_IMPORTS: dict[str, frozenset[str]] = {
    "packing": frozenset({"common", "settings"}),
    "serving": frozenset({"common", "triton", "settings"}),
    "triton": frozenset({"common", "settings"}),
    "python_models": frozenset({"common"}),
    "all_models": frozenset({"python_models", "common"}),
    "common": frozenset(),
    "settings": frozenset(),
}
