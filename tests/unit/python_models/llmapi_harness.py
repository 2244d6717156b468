"""Runs the llmapi model (python_models/llmapi/model.py) without Triton: pb_utils as the stub
gives it to a model (tensors, responses, errors, a response sender per request), so a test
calls initialize / execute / finalize and reads what each request was sent."""

from __future__ import annotations

import json
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import yaml


class Tensor:
    def __init__(self, name: str, array: Any) -> None:
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class TritonError:
    CANCELLED = 1

    def __init__(self, message: str, code: int | None = None) -> None:
        self._message = message

    def message(self) -> str:
        return self._message


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: Any = None) -> None:
        self.output_tensors = output_tensors or []
        self.error = error

    def outputs(self) -> dict[str, Any]:
        """Each output as a Python value: lists for arrays, str for strings."""
        values = {}
        for tensor in self.output_tensors:
            array = tensor.as_numpy()
            values[tensor.name()] = (
                [v.decode() if isinstance(v, bytes) else v for v in array.tolist()]
                if array.dtype == np.object_
                else array.tolist()
            )
        return values


class Logger:
    @staticmethod
    def log_info(message: str) -> None:
        pass

    log_warn = log_error = log_info


class MetricFamily:
    """Triton's custom metrics, recorded in `values` (name -> labels -> value)."""

    GAUGE, COUNTER = "gauge", "counter"
    values: dict[str, dict[tuple, float]] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: dict[str, str]) -> Any:
        family, key = self, tuple(sorted(labels.items()))

        class Metric:
            def set(self, value: float) -> None:
                MetricFamily.values.setdefault(family.name, {})[key] = value

            def increment(self, value: float) -> None:
                current = MetricFamily.values.setdefault(family.name, {}).get(key, 0.0)
                MetricFamily.values[family.name][key] = current + value

        return Metric()


def _fake_pb_utils() -> types.ModuleType:
    module = types.ModuleType("triton_python_backend_utils")
    vars(module).update(
        Tensor=Tensor,
        TritonError=TritonError,
        InferenceResponse=InferenceResponse,
        Logger=Logger,
        MetricFamily=MetricFamily,
        TRITONSERVER_RESPONSE_COMPLETE_FINAL=1,
    )
    module.get_input_tensor_by_name = lambda request, name: request.tensors.get(name)
    module.using_decoupled_model_transaction_policy = lambda config: bool(
        config.get("model_transaction_policy", {}).get("decoupled")
    )
    return module


PB_UTILS = _fake_pb_utils()


class Sender:
    """A request's response sender: records what was sent; `cancel()` is the client leaving."""

    def __init__(self) -> None:
        self.responses: list[InferenceResponse] = []
        self.final = threading.Event()
        self.cancelled = False
        self.flags_only = 0  # final flags sent without a response

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self.cancelled:
            raise RuntimeError("the client cancelled the request")
        if response is not None:
            self.responses.append(response)
        elif flags:
            self.flags_only += 1
        if flags & 1:
            self.final.set()

    def is_cancelled(self) -> bool:
        return self.cancelled

    def cancel(self) -> None:
        self.cancelled = True
        self.final.set()  # nothing more will be read


class Request:
    def __init__(self, request_id: str = "", **tensors: Any) -> None:
        self.tensors = {name: Tensor(name, value) for name, value in tensors.items()}
        self._id = request_id
        self.sender = Sender()

    def request_id(self) -> str:
        return self._id

    def get_response_sender(self) -> Sender:
        return self.sender

    def is_cancelled(self) -> bool:
        return self.sender.cancelled

    # -- what came back --------------------------------------------------------------------------
    def wait(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        assert self.sender.final.wait(timeout), "no final response"
        return [response.outputs() for response in self.sender.responses]

    def error(self, timeout: float = 30.0) -> str | None:
        self.wait(timeout)
        errors = [r.error.message() for r in self.sender.responses if r.error is not None]
        return errors[0] if errors else None


def text_request(prompt: str, **extra: Any) -> Request:
    """A request as written for NVIDIA's stock model (no batch dimension)."""
    return Request(text_input=np.array([prompt.encode()], np.object_), **_scalars(extra))


def token_request(ids: list[int], request_id: str = "", **extra: Any) -> Request:
    """A token-id request (ours): input_ids, text_input left empty."""
    return Request(
        request_id,
        text_input=np.array([b""], np.object_),
        input_ids=np.array(ids, np.int32),
        **_scalars(extra),
    )


def _scalars(values: dict[str, Any]) -> dict[str, np.ndarray]:
    """Python values as the model's [1] / [-1] tensors."""
    arrays = {}
    for name, value in values.items():
        if isinstance(value, np.ndarray):
            arrays[name] = value
        elif isinstance(value, bool):
            arrays[name] = np.array([value], np.bool_)
        elif isinstance(value, int):
            dtype = np.uint64 if name in ("sampling_param_seed", "lora_id") else np.int32
            arrays[name] = np.array([value], dtype)
        elif isinstance(value, float):
            arrays[name] = np.array([value], np.float32)
        elif isinstance(value, str):
            arrays[name] = np.array([value.encode()], np.object_)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            arrays[name] = np.array([v.encode() for v in value], np.object_)
        else:
            arrays[name] = np.array(value, np.int32)
    return arrays


def model_module(monkeypatch: Any) -> types.ModuleType:
    """python_models.llmapi.model with the fake pb_utils (imported once; pb_utils patched in)."""
    if "triton_python_backend_utils" not in sys.modules:
        monkeypatch.setitem(sys.modules, "triton_python_backend_utils", PB_UTILS)
    from tensorrtllm_backend.python_models.llmapi import model

    monkeypatch.setattr(model, "pb_utils", PB_UTILS)
    return model


def write_version_dir(root: Path, model_yaml: dict[str, Any]) -> Path:
    """<root>/repo/tensorrt_llm/1/model.yaml, as the stored repository has it."""
    version_dir = root / "repo" / "tensorrt_llm" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.yaml").write_text(yaml.safe_dump(model_yaml))
    return version_dir


def start_model(module: types.ModuleType, version_dir: Path, decoupled: bool = True) -> Any:
    model = module.LlmapiModel()
    model.initialize(
        {
            "model_config": json.dumps({"model_transaction_policy": {"decoupled": decoupled}}),
            "model_repository": str(version_dir.parent),
            "model_version": version_dir.name,
            "model_name": "tensorrt_llm",
        }
    )
    return model


def wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
