"""Our LLM-API Triton model (the llmapi workflow's `tensorrt_llm`), inside Triton's python stub.

One model over one engine, whichever engine runs:

  engine.py    the engine interface (a Protocol) and the neutral request and step types
  settings.py  1/model.yaml: NVIDIA's keys, the LLM arguments, what the model itself reads
  tensors.py   Triton request tensors -> an EngineRequest; steps -> Triton response tensors
  model.py     TritonPythonModel: an asyncio loop on its own thread, one task per request,
               cancellation, `stop`, errors per request
  trtllm.py    the adapter: every call into `tensorrt_llm` (LLM, SamplingParams,
               GuidedDecodingParams, LoRARequest, generate_async, abort, RequestOutput)
  cpu.py       the CPU stand-in: the same interface over the CPU engine's scheduler

Nothing here imports `tensorrt_llm` or torch at import time: the engine's module is imported
once the model knows which one runs (python_models/llmapi_choice.py, TRTLLM_LLMAPI_IMPL).
"""
