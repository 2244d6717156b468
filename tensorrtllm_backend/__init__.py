"""Triton side of the BentoML TensorRT-LLM service: model-repository templates, their Python
models, a CPU stand-in for the TensorRT-LLM engine, the tritonserver supervisor and the gRPC client."""
