"""tensorrt_llm on CPU: the stand-in for TensorRT-LLM used when the template is filled with
triton_backend:python (with triton_backend:tensorrtllm NVIDIA's C++ backend ignores this file).

Same tensors as NVIDIA's backend; tokens come from tensorrtllm_backend.python_models.cpu_engine,
configured by the CPU engine dir in the `gpt_model_path` parameter (${engine_dir}).
"""

import json
import os
import sys
from pathlib import Path

# Triton's python stub ignores PYTHONPATH: the supervisor passes our paths (venv, package) here.
sys.path[:0] = filter(None, os.environ.get("TRTLLM_BACKEND_PYTHONPATH", "").split(os.pathsep))

import triton_python_backend_utils as pb_utils

from tensorrtllm_backend.common.cpu_engine_config import EngineConfig, load_engine_config
from tensorrtllm_backend.common.guides import GuideError
from tensorrtllm_backend.python_models.cpu_engine.loading import (
    EngineGuides,
    make_backend,
    prefix_cache,
)
from tensorrtllm_backend.python_models.cpu_engine.request import FinishReason, GenRequest
from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler
from tensorrtllm_backend.python_models.cpu_engine.triton_io import (
    EngineLimits,
    RequestError,
    parse_request,
)
from tensorrtllm_backend.python_models.cpu_engine.triton_metrics import MetricsPublisher
from tensorrtllm_backend.python_models.cpu_engine.triton_sink import ResponseGroup
from tensorrtllm_backend.python_models.stub_guard import (
    start_orphan_guard,
    stop_orphan_guard,
)
from tensorrtllm_backend.python_models.stub_settings import cpu_engine_grace_s

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


def _instance_index(args: dict) -> int:
    """This instance's index among the model's (its name ends with it: tensorrt_llm_0_1)."""
    last = str(args.get("model_instance_name", "")).rsplit("_", 1)[-1]
    return int(last) if last.isdigit() else 0


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


def _guides(model_config: dict, config: EngineConfig, model_repository: str) -> EngineGuides | str:
    """The engine's guide compiler, or why guided requests are refused."""
    if config.cpu_engine.mode != "hf":
        return "guided decoding needs a model with logits; the synthetic CPU engine has none"
    backend = _param(model_config, "guided_decoding_backend")
    if backend is None:
        return "guided decoding is off: parameter guided_decoding_backend is not set"
    if backend != "xgrammar":
        return f"guided_decoding_backend {backend!r} is not supported by the CPU engine (xgrammar)"
    tokenizer = _param(model_config, "tokenizer_dir")
    if tokenizer is not None:
        tokenizer_dir = Path(tokenizer)
        if not tokenizer_dir.is_absolute():
            tokenizer_dir = Path(model_repository).parent.parent / tokenizer_dir
    else:  # an hf-mode engine's checkpoint holds its tokenizer
        tokenizer_dir = config.checkpoint_path()
    return EngineGuides(tokenizer_dir.resolve(), config.pretrained_config.vocab_size)


class TritonPythonModel:
    """tensorrt_llm contract on CPU: in-flight batching scheduler + synthetic or hf backend."""

    def initialize(self, args: dict) -> None:
        # Two guards against outliving tritonserver: the shared Python watcher (fast path) and a
        # /bin/sh one for when a thread stuck in IPC to the dead parent holds the GIL.
        self.orphan_guard = start_orphan_guard(cpu_engine_grace_s())
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
        interval = _param(model_config, "stream_interval")
        if interval is not None and not (interval.isdigit() and int(interval) >= 1):
            raise pb_utils.TritonModelException(
                f"parameter stream_interval must be a positive integer, got {interval!r}"
            )
        # The backend first: the guides' thread imports transformers too, and two threads
        # importing its lazy modules at once can each find the other's half-initialized.
        self.prefix_cache = None
        if _bool_param(model_config, "enable_kv_cache_reuse", False):
            budget = _param(model_config, "max_tokens_in_paged_kv_cache")
            self.prefix_cache = prefix_cache(
                build.plugin_config.tokens_per_block,
                int(budget) if budget else None,
                rank=_instance_index(args),
            )
        backend = make_backend(config, self.prefix_cache.table if self.prefix_cache else None)
        self.guides = _guides(model_config, config, args["model_repository"])
        self.scheduler = Scheduler(
            backend,
            build.max_batch_size,
            cancel_poll_interval_s=CANCEL_POLL_INTERVAL_S,
            stream_interval=int(interval or 1),
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
            f"max_batch_size={build.max_batch_size}, decoupled={self.decoupled}, "
            f"stream_interval={interval or 1}"
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
        for kwargs in parsed.sequences:
            if kwargs["guided"] is not None:
                if isinstance(self.guides, str):
                    raise RequestError(self.guides)
                try:
                    kwargs["grammar"] = self.guides.compile(*kwargs["guided"])
                except GuideError as exc:
                    raise RequestError(str(exc)) from None
        group.set_sequences(len(parsed.sequences), parsed.perf_metrics)
        for kwargs in parsed.sequences:
            self.scheduler.submit(GenRequest(sink=group.sink(), **kwargs))

    def finalize(self) -> None:
        self.metrics.stop()
        self.scheduler.stop()
        if self.prefix_cache is not None:
            self.prefix_cache.close()
        stop_orphan_guard(self.orphan_guard)
