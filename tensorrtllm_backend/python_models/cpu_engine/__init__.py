"""CPU stand-in for a TensorRT-LLM engine, served by tensorrt_llm/1/model.py (python backend).

Modules, one job each:
  (the engine directory's format, config.json with a `cpu_engine` section, is
   common/cpu_engine_config.py: pack time writes it, the stub reads it)
  request.py       GenRequest, SamplingParams, the Sink protocol, word-list parsing
  scheduler.py     the in-flight batching loop (one thread, backend-agnostic)
  synthetic.py     deterministic tokens with TTFT / ITL delays (no torch)
  hf.py, sampling.py  transformers + torch backend with batched decode and real sampling
  triton_io.py     Triton request tensors -> GenRequest arguments (one set per sequence)
  triton_sink.py   scheduler events -> pb_utils responses (decoupled or merged)
  triton_metrics.py  scheduler counters as Triton custom metrics
  loading.py       the backend of an engine config, the guide compiler (both CPU slots)
(the llmapi workflow's stand-in, python_models/llmapi/cpu.py, runs this scheduler too)
(the demo checkpoint is built at pack time: packing/demo.py)

Nothing heavy is imported here, so `import tensorrtllm_backend.python_models.cpu_engine` stays cheap.
"""

from ...common.cpu_engine_config import EngineConfig, load_engine_config, write_engine_dir

__all__ = ["EngineConfig", "load_engine_config", "write_engine_dir"]
