"""The service's LoRA cache protocol over real gRPC against a real tritonserver.

The C++ `tensorrtllm` backend (the only engine that applies adapters) cannot run here, and the CPU
engine refuses LoRA. So the `tensorrt_llm` slot holds a small python model that keeps TensorRT-LLM's
cache contract: weights and config arrive with a task's first request; a task id the cache no
longer holds, sent without weights, is an error saying it was "not found"; the cache has room for
one adapter. It logs what each request carried, so the test sees what the Generator sent.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
from transformers import PreTrainedTokenizerFast

from tensorrtllm_backend.common.lora import LORAS, LoraRegistry
from tensorrtllm_backend.packing.demo import BOS, EOS, PAD, train_tokenizer
from tensorrtllm_backend.serving.chat.stream import answer_steps, collect
from tensorrtllm_backend.serving.generation import EngineLimits, Generator
from tensorrtllm_backend.serving.schemas import SamplingParams
from tensorrtllm_backend.serving.triton_paths import Route
from tensorrtllm_backend.triton.client import TritonLLMClient
from tensorrtllm_backend.triton.command import TritonServerConfig
from tensorrtllm_backend.triton.supervisor import TritonSupervisor
from tests.integration.test_server import PRELUDE, kill_all, process_tree
from tests.lora_helpers import write_adapter

pytestmark = pytest.mark.integration

LORA_CACHE_MODEL = PRELUDE + textwrap.dedent(
    """
    import json
    from collections import OrderedDict

    import numpy as np
    import triton_python_backend_utils as pb_utils

    CAPACITY = 1  # adapters the cache holds: the next one evicts the oldest


    def _get(request, name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()


    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.log_path = config["parameters"]["log_path"]["string_value"]
            self.cache = OrderedDict()

        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                task = _get(request, "lora_task_id")
                weights = _get(request, "lora_weights")
                event = {"task": None if task is None else int(task.reshape(-1)[0]),
                         "weights": weights is not None}
                with open(self.log_path, "a") as log:
                    log.write(json.dumps(event) + "\\n")
                if task is not None:
                    task_id = event["task"]
                    if weights is not None:
                        self.cache[task_id] = weights.shape
                        self.cache.move_to_end(task_id)
                        while len(self.cache) > CAPACITY:
                            self.cache.popitem(last=False)
                    elif task_id not in self.cache:
                        error = pb_utils.TritonError(
                            f"LoRA task {task_id} not found in cache. Please send LoRA weights "
                            "with request"
                        )
                        sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error),
                                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                        continue
                count = int(_get(request, "request_output_len").reshape(-1)[0])
                for i in range(count):
                    ids = np.full((1, 1, 1), 40 + i, np.int32)
                    tensors = [pb_utils.Tensor("output_ids", ids),
                               pb_utils.Tensor("sequence_length", np.ones((1, 1), np.int32))]
                    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == count - 1 else 0
                    sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=final)
            return None
    """
)


def _config(log_path: Path) -> str:
    optional = "".join(
        f'  {{ name: "{name}" data_type: {dtype} dims: [ {dims} ] optional: true }},\n'
        for name, dtype, dims in (
            ("end_id", "TYPE_INT32", "1"),
            ("pad_id", "TYPE_INT32", "1"),
            ("streaming", "TYPE_BOOL", "1"),
            ("exclude_input_in_output", "TYPE_BOOL", "1"),
            ("lora_task_id", "TYPE_UINT64", "1"),
            ("lora_weights", "TYPE_FP16", "-1, -1"),
            ("lora_config", "TYPE_INT32", "-1, 3"),
        )
    )
    return (
        textwrap.dedent(
            """\
        name: "tensorrt_llm"
        backend: "python"
        max_batch_size: 8
        model_transaction_policy { decoupled: true }
        input [
          { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] },
          { name: "input_lengths" data_type: TYPE_INT32 dims: [ 1 ] },
          { name: "request_output_len" data_type: TYPE_INT32 dims: [ 1 ] },
        """
        )
        + optional.rstrip(",\n")
        + textwrap.dedent(
            f"""
        ]
        output [
          {{ name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] }},
          {{ name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] }}
        ]
        parameters {{ key: "log_path" value: {{ string_value: "{log_path}" }} }}
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        """
        )
    )


@pytest.fixture
async def generator(tmp_path: Path) -> AsyncIterator[tuple[Generator, Path]]:
    log_path = tmp_path / "requests.jsonl"
    model = tmp_path / "repo" / "tensorrt_llm"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(_config(log_path))
    (model / "1" / "model.py").write_text(LORA_CACHE_MODEL)
    for name in ("sql", "chat"):
        write_adapter(tmp_path / "stored" / LORAS / name)
    supervisor = TritonSupervisor(
        TritonServerConfig(
            model_repository=tmp_path / "repo", startup_timeout_s=60, log_dir=tmp_path
        )
    )
    seen: list[psutil.Process] = []
    client = None
    try:
        supervisor.start()
        seen += process_tree(supervisor.pid)
        client = TritonLLMClient(supervisor.grpc_url)
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=train_tokenizer(), bos_token=BOS, eos_token=EOS, pad_token=PAD
        )
        yield (
            Generator(
                client,
                tokenizer,
                EngineLimits(max_input_len=64, max_seq_len=256, max_batch_size=8),
                Route.DIRECT,
                loras=LoraRegistry.from_model(tmp_path / "stored"),
                lora_supported=True,
            ),
            log_path,
        )
    finally:
        if client is not None:
            await client.close()
        seen += process_tree(supervisor.pid)
        supervisor.stop()
        kill_all(seen)


async def test_weights_on_first_use_and_again_after_eviction(
    generator: tuple[Generator, Path],
) -> None:
    gen, log_path = generator
    params = SamplingParams(max_tokens=3, ignore_eos=True)

    async def run(adapter: str | None) -> int:
        prepared = gen.prepare("Once upon a time", params, lora=adapter)
        answer = await collect(prepared, answer_steps(gen, prepared))
        return answer.usage.completion_tokens

    # sql: first use with weights; then the id alone; chat evicts sql (the cache holds one);
    # sql again: id alone -> "not found" -> sent again with its weights; the base model: no LoRA.
    for adapter in ("sql", "sql", "chat", "sql", None):
        assert await run(adapter) == 3
    sql, chat = gen.loras.get("sql").task_id, gen.loras.get("chat").task_id  # type: ignore[union-attr]
    events = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert events == [
        {"task": sql, "weights": True},
        {"task": sql, "weights": False},
        {"task": chat, "weights": True},
        {"task": sql, "weights": False},
        {"task": sql, "weights": True},
        {"task": None, "weights": False},
    ]
