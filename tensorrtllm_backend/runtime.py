"""What the service owns while it runs: the stored model resolved on this machine, the supervised
tritonserver, the gRPC client and the generator that every API uses."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .client import TritonLLMClient
from .engine import EngineInfo, inspect_engine
from .generation import EngineLimits, Generator
from .guided import GuideCompiler
from .lora import LoraRegistry
from .metrics import generation_metrics
from .openai_api.tool_parsers import FORMATS
from .packing import ENGINES, REPOSITORY, TOKENIZER, read_manifest
from .repository import CONFIG_NAME, TemplateError, localize_repository, parse_config
from .routes import ROUTE_MODELS, Route
from .server import ServerState, TritonServerConfig, TritonSupervisor
from .sharing import SharedTriton
from .tokenization import load_tokenizer
from .watchdog import StallWatchdog

logger = logging.getLogger(__name__)

GRPC_PORT_ENV = "TRTLLM_TRITON_GRPC_PORT"
HTTP_PORT_ENV = "TRTLLM_TRITON_HTTP_PORT"
METRICS_PORT_ENV = "TRTLLM_TRITON_METRICS_PORT"
PORT_ENVS = (GRPC_PORT_ENV, HTTP_PORT_ENV, METRICS_PORT_ENV)
WORKERS_ENV = "TRTLLM_WORKERS"
SHARED_DIR_ENV = "TRTLLM_SHARED_DIR"  # where workers sharing a tritonserver keep its lock
STREAM_INTERVAL_ENV = "TRTLLM_STREAM_INTERVAL"
TOOL_PARSER_ENV = "TRTLLM_TOOL_PARSER"


def _env_count(name: str, what: str) -> int:
    """A whole number >= 1 from the environment; 1 when unset."""
    value = os.environ.get(name, "").strip()
    if not value:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{name}={value!r}: give a number of {what}, 1 or more")
    return int(value)


def worker_count() -> int:
    """HTTP worker processes (TRTLLM_WORKERS, default 1); they share one tritonserver."""
    return _env_count(WORKERS_ENV, "worker processes")


def _env_port(name: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        port = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a port number") from None
    if not 0 < port < 65536:
        raise ValueError(f"{name}={value} is out of range 1-65535")
    return port


def _tool_parser() -> str | None:
    value = os.environ.get(TOOL_PARSER_ENV, "").strip()
    if not value:
        return None
    known = (*FORMATS, "none")
    if value not in known:
        raise ValueError(f"{TOOL_PARSER_ENV}={value!r}: give one of {', '.join(known)}")
    return value


@dataclass(frozen=True)
class RuntimeSettings:
    """Knobs read from the environment (documented in the README)."""

    route: Route | None = None  # None: the route stored with the model
    grpc_port: int | None = None
    http_port: int | None = None
    metrics_port: int | None = None
    startup_timeout_s: float = 600.0
    stall_timeout_s: float = 120.0  # restart a Triton that answers nothing for this long; 0: off
    workers: int = 1  # HTTP workers sharing the tritonserver
    stream_interval: int = 1  # pieces per streamed HTTP message after the first (streaming.py)
    shared_dir: Path | None = None
    tool_parser: str | None = None  # the model's tool-call format; None: from its chat template

    @classmethod
    def from_env(cls) -> RuntimeSettings:
        route = os.environ.get("TRTLLM_ROUTE")
        return cls(
            route=Route(route) if route else None,
            grpc_port=_env_port(GRPC_PORT_ENV),
            http_port=_env_port(HTTP_PORT_ENV),
            metrics_port=_env_port(METRICS_PORT_ENV),
            startup_timeout_s=float(os.environ.get("TRTLLM_STARTUP_TIMEOUT_S", "600")),
            stall_timeout_s=float(os.environ.get("TRTLLM_STALL_TIMEOUT_S", "120")),
            workers=worker_count(),
            stream_interval=_env_count(STREAM_INTERVAL_ENV, "pieces per streamed message"),
            shared_dir=Path(os.environ[SHARED_DIR_ENV]) if os.environ.get(SHARED_DIR_ENV) else None,
            tool_parser=_tool_parser(),
        )


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


def _llmapi_limits(manifest: dict[str, Any]) -> EngineLimits:
    limits = manifest.get("limits") or {}
    return EngineLimits(
        max_input_len=int(limits["max_input_len"]),
        max_seq_len=int(limits["max_seq_len"]),
        max_beam_width=1,
        max_batch_size=int(limits.get("max_batch_size") or 1),
    )


class LLMRuntime:
    def __init__(self, model_root: Path, settings: RuntimeSettings | None = None) -> None:
        self.model_root = Path(model_root)
        self.settings = settings or RuntimeSettings()
        manifest = read_manifest(self.model_root)
        self.workflow = str(manifest.get("workflow", "engine"))
        self.route = _route(self.settings.route, manifest, self.workflow)
        # The llmapi workflow has no engine: its limits were recorded at pack time, and the LLM
        # API starts its tp x pp ranks itself, under one tritonserver.
        self.engine: EngineInfo | None = None
        if self.workflow == LLMAPI_WORKFLOW:
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
        self._run_dir: Path | None = None
        self._watchdog: asyncio.Task[None] | None = None

    @property
    def served_model_name(self) -> str:
        """The name clients use (OpenAI `model`): the stored model's name."""
        return os.environ.get("TRTLLM_SERVED_MODEL_NAME") or self.model_root.parent.name

    @property
    def generator(self) -> Generator:
        if self._generator is None:
            raise RuntimeError("the runtime is not started")
        return self._generator

    async def start(self) -> None:
        self._run_dir = Path(tempfile.mkdtemp(prefix="trtllm-run-"))
        repository = localize_repository(
            self.model_root / REPOSITORY, self._run_dir / REPOSITORY, self.model_root
        )
        settings = self.settings
        config = TritonServerConfig(
            model_repository=repository,
            grpc_port=settings.grpc_port,
            http_port=settings.http_port,
            metrics_port=settings.metrics_port,
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
        # transformers' import and the tokenizer's load (~3 s) overlap tritonserver's start.
        tokenizer_loading = asyncio.ensure_future(
            asyncio.to_thread(load_tokenizer, self.model_root / TOKENIZER)
        )
        try:
            await asyncio.to_thread(triton.start)
            tokenizer = await tokenizer_loading
        except BaseException:
            tokenizer_loading.cancel()
            await asyncio.to_thread(triton.stop)
            raise
        self._client = TritonLLMClient(triton.grpc_url, self._restart_for_dead_instance)
        self._generator = Generator(
            self._client,
            tokenizer,
            self.limits,
            self.route,
            generation_metrics(),
            self.loras,
            lora_supported=self.engine is not None
            and self.engine.kind == "tensorrt_llm"
            and self.engine.lora_enabled,
            guides=GuideCompiler(tokenizer, self.engine.vocab_size if self.engine else None),
            guides_unsupported=self._guides_unsupported(),
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

    def _guides_unsupported(self) -> str | None:
        """Why this model cannot enforce guided decoding, or None when it can."""
        if self.engine is None:
            return (
                "guided decoding is not offered by the LLM API workflow: NVIDIA's llmapi Triton "
                "model takes no guide inputs (pack TensorRT-LLM engines for guided decoding)"
            )
        if self.engine.kind == "cpu" and self.engine.cpu_mode == "synthetic":
            return (
                "guided decoding needs a model with logits; this model's synthetic CPU engine "
                "has none (pack --demo, --hf-model or a TensorRT-LLM engine)"
            )
        config_file = self.model_root / REPOSITORY / ROUTE_MODELS[Route.DIRECT] / CONFIG_NAME
        try:
            config = parse_config(config_file.read_text(), source=str(config_file))
            backend = config.parameters["guided_decoding_backend"].string_value.strip()
        except (OSError, TemplateError, KeyError):
            backend = ""
        if not backend or backend.startswith("${"):
            return (
                "guided decoding is off for this model: pack it with "
                "--guided-decoding-backend xgrammar"
            )
        if importlib.util.find_spec("xgrammar") is None:
            return "guided decoding needs the xgrammar package in the service's environment"
        return None

    def _models_to_load(self) -> tuple[str, ...]:
        """The direct route talks to tensorrt_llm alone: the ensemble's Python models would each
        start a stub and load the tokenizer for nothing (seconds of start-up, ~300 MB apiece).
        The text routes load the whole repository, whose BLS may call models of its own."""
        if self.route in (Route.DIRECT, Route.LLMAPI):
            return (ROUTE_MODELS[self.route],)
        return ()

    async def is_ready(self) -> bool:
        if self.triton is None or self._generator is None:
            return False
        return await asyncio.to_thread(self.triton.is_ready)

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
