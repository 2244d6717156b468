"""CPU stand-in for a TensorRT-LLM engine, served by tensorrt_llm/1/model.py (python backend).

Modules, one job each:
  config.py        engine dir format (config.json with a `cpu_engine` section): write / load
  request.py       GenRequest, SamplingParams, the Sink protocol, word-list parsing
  scheduler.py     the in-flight batching loop (one thread, backend-agnostic)
  synthetic.py     deterministic tokens with TTFT / ITL delays (no torch)
  hf.py, sampling.py  transformers + torch backend with batched decode and real sampling
  triton_io.py     Triton request tensors -> GenRequest arguments (one set per sequence)
  triton_sink.py   scheduler events -> pb_utils responses (decoupled or merged)
  triton_metrics.py  scheduler counters as Triton custom metrics
  demo.py          offline demo checkpoint (tokenizer trained on corpus.txt + tiny Llama)

Nothing heavy is imported here, so `import tensorrtllm_backend.cpu_engine` stays cheap.
"""

from .config import EngineConfig, load_engine_config, write_engine_dir

__all__ = ["EngineConfig", "load_engine_config", "write_engine_dir"]
