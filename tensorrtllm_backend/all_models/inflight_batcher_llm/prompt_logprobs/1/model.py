"""prompt_logprobs: a prompt's token log probs from the engine's context logits (BLS).

One engine request per prompt: one token to generate, `return_context_logits` set; the logits
are reduced here (:mod:`tensorrtllm_backend.python_models.prompt_scores`), on the GPU when the
engine left them there, and only the reduction is answered.
"""

import json
import os
import sys

# Triton's python stub ignores PYTHONPATH: the supervisor passes our paths (venv, package) here.
sys.path[:0] = filter(None, os.environ.get("TRTLLM_BACKEND_PYTHONPATH", "").split(os.pathsep))

import numpy as np
import triton_python_backend_utils as pb_utils

from tensorrtllm_backend.python_models.bls.params import model_parameter
from tensorrtllm_backend.python_models.prompt_scores import OUTPUTS, reduce_logits
from tensorrtllm_backend.python_models.stub_guard import start_orphan_guard

MAX_TOP_LOG_PROBS = 20
GATHER_HINT = (
    "prompt log probs need the engine's context logits: build the engine with "
    "`trtllm-build --gather_context_logits`"
)


def _scalar(request, name: str, default: int) -> int:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None or tensor.as_numpy().size == 0:
        return default
    return int(tensor.as_numpy().reshape(-1)[0])


def _logits(tensor):
    """The context logits where they are: a numpy array on the host, a torch tensor on a GPU."""
    if tensor.is_cpu():
        return tensor.as_numpy()
    import torch.utils.dlpack

    return torch.utils.dlpack.from_dlpack(tensor.to_dlpack())


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self._orphan_guard = start_orphan_guard()  # exits with the stub
        config = json.loads(args["model_config"])
        self.engine = model_parameter(config, "tensorrt_llm_model_name") or "tensorrt_llm"

    def execute(self, requests):
        return [self._score(request) for request in requests]

    def _score(self, request):
        try:
            prompt = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            prompt = prompt.reshape(-1).astype(np.int32)
            k = _scalar(request, "top_log_probs", 0)
            if not 0 <= k <= MAX_TOP_LOG_PROBS:
                raise ValueError(f"top_log_probs must be 0 to {MAX_TOP_LOG_PROBS}, got {k}")
            if prompt.size == 0:
                raise ValueError("input_ids is empty")
            logits = self._context_logits(request, prompt)
            vocab = _scalar(request, "vocab_size", 0)
            if vocab:  # the engine's padding columns (tensor parallelism) are no tokens
                logits = logits[..., :vocab]
            scores = reduce_logits(logits, prompt.tolist(), k)
        except (ValueError, RuntimeError) as error:
            error = pb_utils.TritonError(str(error))
            return pb_utils.InferenceResponse(output_tensors=[], error=error)
        tensors = [
            pb_utils.Tensor(name, array) for name, array in zip(OUTPUTS, scores, strict=True)
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _context_logits(self, request, prompt: np.ndarray):
        inputs = {
            "input_ids": prompt[None],
            "input_lengths": np.array([[prompt.size]], dtype=np.int32),
            "request_output_len": np.array([[1]], dtype=np.int32),
            "return_context_logits": np.array([[True]]),
            "streaming": np.array([[False]]),
        }
        for name in ("end_id", "pad_id"):
            value = _scalar(request, name, -2)
            if value != -2:
                inputs[name] = np.array([[value]], dtype=np.int32)
        engine_request = pb_utils.InferenceRequest(
            model_name=self.engine,
            inputs=[pb_utils.Tensor(name, array) for name, array in inputs.items()],
            requested_output_names=["context_logits"],
        )
        logits = None
        for response in engine_request.exec(decoupled=True):
            if response.has_error():
                message = response.error().message()
                hint = f" ({GATHER_HINT})" if "context" in message.lower() else ""
                raise RuntimeError(f"the engine failed: {message}{hint}")
            tensor = pb_utils.get_output_tensor_by_name(response, "context_logits")
            if tensor is not None and logits is None:
                logits = _logits(tensor)
        if logits is None or 0 in logits.shape:
            raise RuntimeError(f"the engine returned no context logits: {GATHER_HINT}")
        return logits
