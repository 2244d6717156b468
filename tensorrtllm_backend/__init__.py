"""BentoML × TensorRT-LLM: everything behind `service.py` and `pack_model.py`.

The subpackages are grouped by the process that runs them:

- ``build/``          pack time (`pack_model.py`, `python -m tensorrtllm_backend.build.fill_template`):
                      engine / checkpoint inspection, template filling, the model-store writer.
- ``serving/``        the BentoML worker, API side: schemas, the one generation path, route
                      objects, the native and OpenAI adapters, errors, limits, metrics.
- ``triton/``         the BentoML worker, process side: finding and starting tritonserver,
                      supervising it, sharing it between workers, the gRPC client.
- ``python_models/``  inside Triton's python stubs: helpers of the pre/post-processing and BLS
                      models, the stub guard, and the CPU stand-in engine.
- ``common/``         small modules more than one of those processes imports (tokenization,
                      the engine config reader, the CPU engine's directory format, LoRA files).
- ``all_models/``     the Triton model-repository templates; their `model.py` files run in the
                      stubs and only import from ``python_models/`` and ``common/``.
- ``settings.py``     every `TRTLLM_*` variable, read in one place.
"""
