"""prompt_logprobs: a prompt's token log probs from the engine's context logits (BLS).

One engine request per prompt: one token to generate, `return_context_logits` set; the logits
are reduced here (:mod:`tensorrtllm_backend.python_models.prompt_scores`), on the GPU when the
engine left them there, and only the reduction is answered; a request that asks for the
`next_top_*` outputs gets the k most likely tokens after the prompt too (the first generated
token's alternatives, where the generation returns none). Decoupled, each request on a worker
thread of its own: many prompts are in the engine at once, batched as it batches generation.
"""

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

# Triton's python stub ignores PYTHONPATH: the supervisor passes our paths (venv, package) here.
sys.path[:0] = filter(None, os.environ.get("TRTLLM_BACKEND_PYTHONPATH", "").split(os.pathsep))

import numpy as np
import triton_python_backend_utils as pb_utils

from tensorrtllm_backend.python_models.bls.params import model_parameter
from tensorrtllm_backend.python_models.prompt_scores import (
    NEXT_OUTPUTS,
    OUTPUTS,
    reduce_logits,
    reduce_next_token,
)
from tensorrtllm_backend.python_models.stub_guard import start_orphan_guard

MAX_TOP_LOG_PROBS = 20
MAX_WORKERS = 64  # prompts scored at once per instance; more wait for a free worker
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
    """The context logits where they are: a numpy array on the host, a torch tensor on a GPU
    (views into the engine's response, which the caller keeps alive while they are read)."""
    if tensor.is_cpu():
        return tensor.as_numpy()
    import torch.utils.dlpack

    return torch.utils.dlpack.from_dlpack(tensor.to_dlpack())


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self._orphan_guard = start_orphan_guard()  # exits with the stub
        config = json.loads(args["model_config"])
        self.engine = model_parameter(config, "tensorrt_llm_model_name") or "tensorrt_llm"
        self.pool = ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="score")

    def execute(self, requests):
        for request in requests:
            self.pool.submit(self._serve, request)
        return None

    def finalize(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _serve(self, request) -> None:
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            tensors = self._score(request)
            # The tensors stay referenced until send returns: Python 3.12's stub frees a
            # response's tensors with the GIL released.
            sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=final)
        except Exception as error:  # the request must end with a final response whatever happens
            message = str(error) if isinstance(error, (ValueError, RuntimeError)) else repr(error)
            try:
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=final
                )
            except Exception:  # the client is gone
                pass

    def _score(self, request) -> list:
        prompt = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
        prompt = prompt.reshape(-1).astype(np.int32)
        k = _scalar(request, "top_log_probs", 0)
        if not 0 <= k <= MAX_TOP_LOG_PROBS:
            raise ValueError(f"top_log_probs must be 0 to {MAX_TOP_LOG_PROBS}, got {k}")
        if prompt.size == 0:
            raise ValueError("input_ids is empty")
        responses = self._engine_responses(request, prompt)  # alive while the logits are read
        logits = None
        for response in responses:
            tensor = pb_utils.get_output_tensor_by_name(response, "context_logits")
            if tensor is not None:
                logits = _logits(tensor)
                break
        if logits is None or 0 in logits.shape:
            raise RuntimeError(f"the engine returned no context logits: {GATHER_HINT}")
        vocab = _scalar(request, "vocab_size", 0)
        if vocab:  # the engine's padding columns (tensor parallelism) are no tokens
            logits = logits[..., :vocab]
        scores = reduce_logits(logits, prompt.tolist(), k)
        outputs = list(zip(OUTPUTS, scores, strict=True))
        if set(NEXT_OUTPUTS) & set(request.requested_output_names()):
            next_token = reduce_next_token(logits, prompt.size, k)
            outputs += zip(NEXT_OUTPUTS, next_token, strict=True)
        return [pb_utils.Tensor(name, array) for name, array in outputs]

    def _engine_responses(self, request, prompt: np.ndarray) -> list:
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
        responses = []
        for response in engine_request.exec(decoupled=True):
            if response.has_error():
                message = response.error().message()
                hint = f" ({GATHER_HINT})" if "context" in message.lower() else ""
                raise RuntimeError(f"the engine failed: {message}{hint}")
            responses.append(response)
        return responses
