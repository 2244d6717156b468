import os
import sys

# The Triton python stub may run a different interpreter than the service's venv and ignores
# PYTHONPATH: the supervisor passes the paths to add (venv site-packages, our package's parent).
for _path in reversed(os.environ.get("TRTLLM_BACKEND_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

# tensorrt_llm on CPU: the stand-in for TensorRT-LLM used when the template is filled with
# triton_backend:python (with triton_backend:tensorrtllm NVIDIA's C++ backend ignores this file).
# Same tensors as NVIDIA's backend; tokens come from tensorrtllm_backend.cpu_engine, configured by
# the CPU engine dir in the `gpt_model_path` parameter (${engine_dir}).

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import triton_python_backend_utils as pb_utils  # noqa: E402

from tensorrtllm_backend.cpu_engine.config import EngineConfig, load_engine_config  # noqa: E402
from tensorrtllm_backend.cpu_engine.request import FinishReason, GenRequest  # noqa: E402
from tensorrtllm_backend.cpu_engine.scheduler import Backend, Scheduler  # noqa: E402
from tensorrtllm_backend.cpu_engine.triton_io import (  # noqa: E402
    EngineLimits,
    RequestError,
    parse_request,
)
from tensorrtllm_backend.cpu_engine.triton_metrics import MetricsPublisher  # noqa: E402
from tensorrtllm_backend.cpu_engine.triton_sink import ResponseGroup  # noqa: E402
from tensorrtllm_backend.stub_guard import (  # noqa: E402
    start_orphan_guard,
    stop_orphan_guard,
)

# Polling is_cancelled() is an IPC round trip per request (measured: every 20 ms cost ~15% of
# the C=64 token rate), so poll at most this often; a cancelled stream leaves within ~0.1 s.
CANCEL_POLL_INTERVAL_S = 0.1


def _param(model_config: dict, name: str) -> str | None:
    """A string parameter; empty or an unfilled ${placeholder} counts as unset."""
    value = model_config.get("parameters", {}).get(name, {}).get("string_value", "")
    value = value.strip()
    if not value or value.startswith("${"):
        return None
    return value


def _bool_param(model_config: dict, name: str, default: bool) -> bool:
    value = _param(model_config, name)
    if value is None:
        return default
    return value.lower() in ("1", "true", "yes", "on")


def _resolve_engine_dir(value: str, model_repository: str) -> Path:
    """Absolute paths as given; relative ones against the model root (the repository's parent),
    then the repository, then this model's directory."""
    path = Path(value)
    if path.is_absolute():
        return path
    model_dir = Path(model_repository)
    for base in (model_dir.parent.parent, model_dir.parent, model_dir):
        if (base / path / "config.json").is_file():
            return (base / path).resolve()
    return (model_dir.parent.parent / path).resolve()


def _make_backend(config: EngineConfig) -> Backend:
    section = config.cpu_engine
    if section.mode == "synthetic":
        from tensorrtllm_backend.cpu_engine.synthetic import SyntheticBackend

        return SyntheticBackend(
            vocab_size=config.pretrained_config.vocab_size,
            eos_token_id=section.eos_token_id,
            ttft_ms=section.ttft_ms,
            itl_ms=section.itl_ms,
            seed=section.seed,
        )
    from tensorrtllm_backend.cpu_engine.hf import HFBackend

    return HFBackend(config.checkpoint_path(), device=section.device)


class TritonPythonModel:
    """tensorrt_llm contract on CPU: in-flight batching scheduler + synthetic or hf backend."""

    def initialize(self, args: dict) -> None:
        # Two guards against outliving tritonserver: the shared Python watcher (fast path) and a
        # /bin/sh one for when a thread stuck in IPC to the dead parent holds the GIL.
        self.orphan_guard = start_orphan_guard(
            float(os.environ.get("TRTLLM_CPU_ENGINE_ORPHAN_GRACE_S", "10"))
        )
        model_config = json.loads(args["model_config"])
        self.logger = pb_utils.Logger
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        engine_value = _param(model_config, "gpt_model_path")
        if engine_value is None:
            raise pb_utils.TritonModelException(
                "parameter gpt_model_path (engine_dir) must point at a CPU engine dir"
            )
        engine_dir = _resolve_engine_dir(engine_value, args["model_repository"])
        config = load_engine_config(engine_dir)
        build = config.build_config
        beam_param = _param(model_config, "max_beam_width")
        max_beam = (
            min(int(beam_param), build.max_beam_width) if beam_param else build.max_beam_width
        )
        self.limits = EngineLimits(
            max_input_len=build.max_input_len,
            max_seq_len=build.max_seq_len,
            max_beam_width=max_beam,
            vocab_size=config.pretrained_config.vocab_size,
            default_end_id=None,  # as TensorRT-LLM: no end id unless the request sends one
            exclude_input_in_output=_bool_param(model_config, "exclude_input_in_output", False),
            max_batch_size=build.max_batch_size,
        )
        self.scheduler = Scheduler(
            _make_backend(config),
            build.max_batch_size,
            cancel_poll_interval_s=CANCEL_POLL_INTERVAL_S,
        )
        self.scheduler.start()
        self.metrics = MetricsPublisher(
            pb_utils,
            self.scheduler,
            labels={"model": args["model_name"], "version": str(args["model_version"])},
        )
        self.metrics.start()
        self.logger.log_info(
            f"CPU engine ({config.cpu_engine.mode}) from {engine_dir}, "
            f"max_batch_size={build.max_batch_size}, decoupled={self.decoupled}"
        )

    def execute(self, requests: list) -> list | None:
        groups: list[ResponseGroup] = []
        for request in requests:
            group = ResponseGroup(pb_utils, request, decoupled=self.decoupled)
            groups.append(group)
            try:
                self._submit(request, group)
            except RequestError as exc:
                group.fail_all(str(exc))
            except Exception as exc:  # a bad request must never take the model down
                group.fail_all(f"CPU engine rejected the request: {exc}")
        if self.decoupled:
            return None
        for group in groups:
            group.wait()
        return [group.response for group in groups]

    def _submit(self, request, group: ResponseGroup) -> None:
        stop = pb_utils.get_input_tensor_by_name(request, "stop")
        if stop is not None and stop.as_numpy().size and bool(stop.as_numpy().reshape(-1)[0]):
            request_id = request.request_id()
            if not request_id:
                raise RequestError("stop=true needs the request id of the request to cancel")
            self.scheduler.cancel(request_id)
            # Answer the stop request itself with an empty (final) response.
            done = GenRequest(
                prompt=[],
                max_new_tokens=0,
                sink=group.sink(),
                streaming=self.decoupled,
                exclude_input_in_output=True,
            )
            done.sink.finish(done, FinishReason.CANCELLED)
            return
        parsed = parse_request(pb_utils, request, self.limits)
        if parsed.streaming and not self.decoupled:
            raise RequestError("streaming requires the decoupled transaction policy")
        if parsed.max_return_sequences > 1 and not self.decoupled:
            # One merged response has no place for several sequences per row.
            raise RequestError(
                "num_return_sequences > 1 needs the decoupled (streaming) transaction policy"
            )
        # Rows x num_return_sequences GenRequests, each in its own batch slot (TensorRT-LLM's
        # child requests); they share the request id, so stop=true cancels all of them.
        group.set_sequences(len(parsed.sequences), parsed.perf_metrics)
        for kwargs in parsed.sequences:
            self.scheduler.submit(GenRequest(sink=group.sink(), **kwargs))

    def finalize(self) -> None:
        self.metrics.stop()
        self.scheduler.stop()
        stop_orphan_guard(self.orphan_guard)
