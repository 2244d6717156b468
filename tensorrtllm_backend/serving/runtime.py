"""What the service owns while it runs: the stored model resolved on this machine, the supervised
tritonserver, the gRPC client and the generator that every API uses."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..common.engine_config import EngineInfo, inspect_engine
from ..common.guides import GuideCompiler
from ..common.lora import LoraRegistry
from ..common.model_repository import (
    CONFIG_NAME,
    LLMAPI_MODELS,
    TemplateError,
    parse_config,
)
from ..common.model_store import ENGINES, REPOSITORY, TOKENIZER, read_manifest, vision_record
from ..common.tokenization import load_tokenizer
from ..settings import Settings, load_settings
from ..triton.client import TritonLLMClient
from ..triton.command import TritonServerConfig
from ..triton.localize import localize_repository
from ..triton.readiness import Readiness
from ..triton.sharing import SharedTriton
from ..triton.supervisor import ServerState, TritonSupervisor
from ..triton.watchdog import StallWatchdog
from .chat.core import check_parser_names
from .chat.images import Vision, media_limits
from .generation import EngineLimits, Generator
from .metrics import generation_metrics
from .run_dir import make_run_dir
from .triton_paths import PROMPT_SCORER, ROUTE_MODELS, Route

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


LLMAPI_WORKFLOW = "llmapi"


def _route(chosen: Route | None, manifest: dict[str, Any], workflow: str) -> Route:
    """TRTLLM_ROUTE, else the stored route; the llmapi workflow has exactly one."""
    route = chosen or Route(manifest.get("route", Route.DIRECT.value))
    if (route is Route.LLMAPI) != (workflow == LLMAPI_WORKFLOW):
        raise ValueError(
            f"TRTLLM_ROUTE={route.value} does not fit a model packed with the {workflow} workflow"
            + (" (its route is llmapi)" if workflow == LLMAPI_WORKFLOW else "")
        )
    return route


def _check_llmapi_model(manifest: dict[str, Any]) -> None:
    """The llmapi route speaks token ids to our model; NVIDIA's stock model takes text only."""
    model = manifest.get("llmapi_model", LLMAPI_MODELS[0])
    if model != LLMAPI_MODELS[0]:
        raise ValueError(
            f"this model was packed with --llmapi-model {model}: NVIDIA's stock llmapi model "
            "takes text prompts only, while the service's llmapi route sends token ids to the "
            f"{LLMAPI_MODELS[0]} model (every per-request feature, exact usage). Repack without "
            "--llmapi-model, or serve its model_repository with tritonserver directly"
        )


LLMAPI_CPU_SOURCES = ("demo", "synthetic")  # llmapi models packed for the CPU stand-in
# Batch slots of an llmapi model packed without --max-batch-size: the CPU stand-in's default
# (the LLM API's own is larger); each of a request's n sequences takes one.
LLMAPI_DEFAULT_MAX_BATCH_SIZE = 64


def _llmapi_limits(manifest: dict[str, Any]) -> EngineLimits:
    limits = manifest.get("limits") or {}
    return EngineLimits(
        max_input_len=int(limits["max_input_len"]),
        max_seq_len=int(limits["max_seq_len"]),
        max_beam_width=1,
        max_batch_size=int(limits.get("max_batch_size") or LLMAPI_DEFAULT_MAX_BATCH_SIZE),
    )


class LLMRuntime:
    def __init__(self, model_root: Path, settings: Settings | None = None) -> None:
        """`settings`: the service's (settings.py; read from the environment if not given)."""
        self.model_root = Path(model_root)
        self.settings = settings or load_settings()
        check_parser_names(self.settings.tool_parser, self.settings.reasoning_parser)
        manifest = read_manifest(self.model_root)
        self.workflow = str(manifest.get("workflow", "engine"))
        chosen = Route(self.settings.route) if self.settings.route else None
        self.route = _route(chosen, manifest, self.workflow)
        # The llmapi workflow has no engine: its limits were recorded at pack time, and the LLM
        # API starts its tp x pp ranks itself, under one tritonserver.
        self.engine: EngineInfo | None = None
        self.manifest = manifest
        if self.workflow == LLMAPI_WORKFLOW:
            _check_llmapi_model(manifest)
            self.limits = _llmapi_limits(manifest)
            self.launch_ranks = 1
        else:
            self.engine = inspect_engine(self.model_root / ENGINES)
            self.limits = EngineLimits.from_engine(self.engine)
            self.launch_ranks = self.engine.world_size
        self.loras = LoraRegistry.from_model(self.model_root)
        self.triton: TritonSupervisor | SharedTriton | None = None
        self._client: TritonLLMClient | None = None
        self._generator: Generator | None = None
        self._readiness: Readiness | None = None
        self._run_dir: Path | None = None
        self._winding_down = False
        self._watchdog: asyncio.Task[None] | None = None
        self.vision: Vision | None = None  # the model's image side, once started

    @property
    def served_model_name(self) -> str:
        """The name clients use (OpenAI `model`): the stored model's name."""
        return self.settings.served_model_name or self.model_root.parent.name

    @property
    def quantization(self) -> dict[str, Any] | None:
        """The packed model's quantization as pack_model.py recorded it (None: full precision)."""
        packed = self.manifest.get("engine") or self.manifest.get("checkpoint") or {}
        found = packed.get("quantization") if isinstance(packed, dict) else None
        return found if isinstance(found, dict) else None

    @property
    def vision_record(self) -> dict[str, Any] | None:
        """What pack_model.py recorded of a model that takes images (None: text only)."""
        return vision_record(self.manifest)

    @property
    def images_unsupported(self) -> str | None:
        """Why this model takes no images (None: it does): a text-only model, or an engine
        workflow whose C++ backend the service cannot hand images to."""
        if self.engine is not None and self.engine.kind == "tensorrt_llm":
            return (
                "images are not served by TensorRT-LLM engines (the C++ backend takes no "
                "images from this service): pack the checkpoint for the LLM API workflow, "
                "pack_model.py --checkpoint DIR"
            )
        if self.vision_record is None:
            return (
                "this model does not take images: serve a vision-language model (pack_model.py "
                "--checkpoint or --hf-model with an image-text-to-text checkpoint) or send text"
            )
        return None

    @property
    def generator(self) -> Generator:
        if self._generator is None:
            raise RuntimeError("the runtime is not started")
        return self._generator

    async def start(self) -> None:
        self._run_dir = await asyncio.to_thread(make_run_dir)
        settings = self.settings
        repository = localize_repository(
            self.model_root / REPOSITORY,
            self._run_dir / REPOSITORY,
            self.model_root,
            engine_instances=settings.engine_instances,
        )
        config = TritonServerConfig(
            model_repository=repository,
            grpc_port=settings.triton_grpc_port,
            http_port=settings.triton_http_port,
            metrics_port=settings.triton_metrics_port,
            world_size=self.launch_ranks,
            auto_complete_config=self.workflow == LLMAPI_WORKFLOW,
            startup_timeout_s=settings.startup_timeout_s,
            log_dir=self._run_dir / "logs",
            models=self._models_to_load(),
        )
        triton = self.triton = (
            SharedTriton(config, settings.shared_dir)
            if settings.workers > 1
            else TritonSupervisor(config)
        )
        if self._winding_down:  # told to stop while starting
            triton.wind_down()
        guides_unsupported = self._guides_unsupported()
        # transformers' import and the tokenizer's load (~3 s) overlap tritonserver's start.
        tokenizer_loading = asyncio.ensure_future(
            asyncio.to_thread(self._load_tokenizer, guides_unsupported is None)
        )
        try:
            await asyncio.to_thread(triton.start)
            tokenizer = await tokenizer_loading
            if self.images_unsupported is None:
                self.vision = await asyncio.to_thread(self._load_vision)
        except BaseException:
            tokenizer_loading.cancel()
            await asyncio.to_thread(triton.stop)
            raise
        self._client = TritonLLMClient(triton.grpc_url, self._restart_for_dead_instance)
        self._readiness = Readiness(triton, self._client)
        self._readiness.start()
        guides = GuideCompiler(
            tokenizer,
            self.engine.vocab_size if self.engine else None,
            timeout_s=settings.guide_compile_timeout_s,
        )
        if guides_unsupported is None:
            guides.warm_up_in_background()
        self._generator = Generator(
            self._client,
            tokenizer,
            self.limits,
            self.route,
            generation_metrics(),
            self.loras,
            lora_supported=self._lora_supported(),
            guides=guides,
            guides_unsupported=guides_unsupported,
            top_log_probs_unsupported=self._top_log_probs_unsupported(),
            prompt_scores_unsupported=self._prompt_scores_unsupported(),
        )
        if settings.stall_timeout_s > 0:
            client = self._client
            watchdog = StallWatchdog(
                lambda: (client.open_streams, client.responses_received),
                self._restart_stalled,
                settings.stall_timeout_s,
            )
            self._watchdog = asyncio.ensure_future(watchdog.run())
        logger.info(
            "serving %s through %s (route %s)",
            self.model_root.name,
            triton.grpc_url,
            self.route.value,
        )

    def _lora_supported(self) -> bool:
        """Engines built with the LoRA plugin apply adapters, and so does the LLM API; the CPU
        engine and its llmapi stand-in do not."""
        if self.engine is None:
            return self.manifest.get("source") not in LLMAPI_CPU_SOURCES
        return self.engine.kind == "tensorrt_llm" and self.engine.lora_enabled

    def _top_log_probs_unsupported(self) -> str | None:
        """Why this model's engine returns no alternatives to the chosen tokens (None: it does:
        the LLM API and the CPU engine)."""
        if self.engine is not None and self.engine.kind == "tensorrt_llm":
            return (
                "top log probs are not available with TensorRT-LLM engines: the C++ tensorrtllm "
                "backend returns the chosen token's log prob only (the LLM API workflow, "
                "pack_model.py --workflow llmapi, returns alternatives)"
            )
        return None

    def _prompt_scores_unsupported(self) -> str | None:
        """Why this model cannot score prompts (None: it can). The LLM API workflow scores in
        its own model; engines, through the prompt_logprobs model beside them, from their
        context logits."""
        engine = self.engine
        if engine is None:
            return None
        if not self.has_prompt_scorer:
            return (
                "prompt log probs need the prompt_logprobs model, which this model's repository "
                "lacks (packed by an older version): repack the model"
            )
        if not engine.gather_context_logits:
            return (
                "prompt log probs need the engine's context logits: rebuild the engine with "
                "`trtllm-build --gather_context_logits` (or serve a checkpoint with the LLM API "
                "workflow, pack_model.py --workflow llmapi)"
            )
        return None

    def _load_vision(self) -> Vision:
        """The model's processor (stored with its tokenizer) and the image limits."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from ..common.processors import load_processor

        record = self.vision_record
        assert record is not None
        processor = load_processor(self.model_root / TOKENIZER)
        return Vision(processor, media_limits(self.settings), record)

    def _load_tokenizer(self, guided: bool) -> PreTrainedTokenizerBase:
        """The stored tokenizer; with `guided`, xgrammar imported as well.

        xgrammar imports torch. Imported here, during start-up, its objects are in the heap that
        the service freezes once ready (deployment.freeze_startup_heap); imported by the guides'
        warm-up after that, they would be walked by every full collection (~100 ms stalls of
        every stream on two cores).
        """
        tokenizer = load_tokenizer(self.model_root / TOKENIZER)
        if guided:
            import xgrammar  # noqa: F401

        return tokenizer

    def _guides_unsupported(self) -> str | None:
        """Why this model cannot enforce guided decoding, or None when it can."""
        reason = (
            self._engine_guides_unsupported()
            if self.engine is not None
            else self._llmapi_guides_unsupported()
        )
        if reason is None and importlib.util.find_spec("xgrammar") is None:
            return "guided decoding needs the xgrammar package in the service's environment"
        return reason

    def _llmapi_guides_unsupported(self) -> str | None:
        if self.manifest.get("source") == "synthetic":
            return (
                "guided decoding needs a model with logits; this model's synthetic CPU engine "
                "has none (pack --demo or a checkpoint)"
            )
        if not (self.manifest.get("model_yaml") or {}).get("guided_decoding_backend"):
            return (
                "guided decoding is off for this model: its model.yaml sets no "
                "guided_decoding_backend (repack it; pack_model.py sets xgrammar by default)"
            )
        return None

    def _engine_guides_unsupported(self) -> str | None:
        engine = self.engine
        assert engine is not None
        if engine.kind == "cpu" and engine.cpu_mode == "synthetic":
            return (
                "guided decoding needs a model with logits; this model's synthetic CPU engine "
                "has none (pack --demo, --hf-model or a TensorRT-LLM engine)"
            )
        config_file = self.model_root / REPOSITORY / ROUTE_MODELS[Route.DIRECT] / CONFIG_NAME
        try:
            config = parse_config(config_file.read_text(), source=str(config_file))
            backend = config.parameters["guided_decoding_backend"].string_value.strip()
            info = config.parameters["xgrammar_tokenizer_info_path"].string_value.strip()
        except (OSError, TemplateError, KeyError):
            backend = info = ""
        if not backend or backend.startswith("${"):
            return (
                "guided decoding is off for this model: pack it with "
                "--guided-decoding-backend xgrammar"
            )
        if config.backend == "tensorrtllm" and (not info or info.startswith("${")):
            return (
                "guided decoding is off for this model: NVIDIA's C++ backend needs "
                "xgrammar_tokenizer_info_path, which pack_model.py fills; repack the model"
            )
        return None

    def _models_to_load(self) -> tuple[str, ...]:
        """The direct route talks to tensorrt_llm alone: the ensemble's Python models would each
        start a stub and load the tokenizer for nothing (seconds of start-up, ~300 MB apiece).
        The text routes load the whole repository, whose BLS may call models of its own.
        The prompt scorer beside the engine (prompt log probs) is loaded where the repository
        has one."""
        if self.route is Route.LLMAPI:
            return (ROUTE_MODELS[self.route],)
        if self.route is Route.DIRECT:
            scorer = (PROMPT_SCORER,) if self.has_prompt_scorer else ()
            return (ROUTE_MODELS[self.route], *scorer)
        return ()

    @property
    def has_prompt_scorer(self) -> bool:
        return (self.model_root / REPOSITORY / PROMPT_SCORER / CONFIG_NAME).is_file()

    def wind_down(self) -> None:
        """The worker was told to stop: tritonserver is not restarted from now on, whatever
        stops it (see TritonSupervisor.wind_down). Safe from a signal handler."""
        self._winding_down = True
        if self.triton is not None:
            self.triton.wind_down()

    def not_ready_reason(self) -> str | None:
        """None when this replica can serve; else what /readyz's 503 says. No I/O: it answers
        from the supervisor's state and the evidence :class:`Readiness` keeps."""
        triton, readiness = self.triton, self._readiness
        if triton is None or self._generator is None or readiness is None:
            return "the model server is starting"
        why = readiness.not_ready_reason()
        if why is None:  # also while restarting: the new tritonserver already serves
            return None
        failure = triton.failure
        if triton.state is ServerState.FAILED:
            return f"the model server failed and is not restarted: {failure or 'see the log'}"
        if triton.state is ServerState.RESTARTING:
            return f"the model server is restarting ({failure or 'it stopped answering'})"
        if triton.state is ServerState.READY:
            return f"the model server does not serve: {why}"
        return f"the model server is {triton.state.value}"

    def triton_metrics_url(self) -> str | None:
        """Triton's loopback metrics URL, or None while it is not running."""
        triton = self.triton
        if triton is None or triton.state is not ServerState.READY:
            return None
        return triton.metrics_url

    async def _restart_stalled(self, stalled_s: float, open_streams: int) -> None:
        if self.triton is not None:
            reason = (
                f"no response for {stalled_s:.0f} s while {open_streams} stream(s) waited on it "
                "(TRTLLM_STALL_TIMEOUT_S)"
            )
            await asyncio.to_thread(self.triton.restart, reason)

    def _restart_for_dead_instance(self, instance: str) -> None:
        # Only a server that is up: requests in flight when it went down report the same
        # instance, and must not kill the tritonserver that replaces it.
        triton = self.triton
        if triton is not None and triton.state is ServerState.READY:
            triton.restart(f"its model instance {instance} died or stopped answering")

    async def stop(self) -> None:
        if self._readiness is not None:
            await asyncio.to_thread(self._readiness.stop)
            self._readiness = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self.triton is not None:
            await asyncio.to_thread(self.triton.stop)
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None
