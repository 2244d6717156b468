"""What the service owns while it runs: the stored model resolved on this machine, the supervised
tritonserver, the gRPC client and the generator that every API uses."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .client import TritonLLMClient
from .engine import EngineInfo, inspect_engine
from .generation import ROUTE_MODELS, EngineLimits, Generator, Route
from .lora import LoraRegistry
from .metrics import generation_metrics
from .packing import ENGINES, REPOSITORY, TOKENIZER, read_manifest
from .repository import localize_repository
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
ENGINE_INSTANCES_ENV = "TRTLLM_ENGINE_INSTANCES"  # CPU stand-in: tensorrt_llm model instances


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


def engine_instances() -> int | None:
    """Instances of the CPU stand-in's tensorrt_llm model (TRTLLM_ENGINE_INSTANCES); None when
    unset: the stored repository's count (1). TensorRT-LLM engines ignore it."""
    if not os.environ.get(ENGINE_INSTANCES_ENV, "").strip():
        return None
    return _env_count(ENGINE_INSTANCES_ENV, "engine instances")


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
    engine_instances: int | None = None  # CPU stand-in only; None: as stored

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
            engine_instances=engine_instances(),
        )


class LLMRuntime:
    def __init__(self, model_root: Path, settings: RuntimeSettings | None = None) -> None:
        self.model_root = Path(model_root)
        self.settings = settings or RuntimeSettings()
        manifest = read_manifest(self.model_root)
        self.engine: EngineInfo = inspect_engine(self.model_root / ENGINES)
        self.route = self.settings.route or Route(manifest.get("route", Route.DIRECT.value))
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
        settings = self.settings
        repository = localize_repository(
            self.model_root / REPOSITORY,
            self._run_dir / REPOSITORY,
            self.model_root,
            engine_instances=settings.engine_instances,
        )
        config = TritonServerConfig(
            model_repository=repository,
            grpc_port=settings.grpc_port,
            http_port=settings.http_port,
            metrics_port=settings.metrics_port,
            world_size=self.engine.world_size,
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
            EngineLimits.from_engine(self.engine),
            self.route,
            generation_metrics(),
            self.loras,
            lora_supported=self.engine.kind == "tensorrt_llm" and self.engine.lora_enabled,
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

    def _models_to_load(self) -> tuple[str, ...]:
        """The direct route talks to tensorrt_llm alone: the ensemble's Python models would each
        start a stub and load the tokenizer for nothing (seconds of start-up, ~300 MB apiece).
        The text routes load the whole repository, whose BLS may call models of its own."""
        if self.route is Route.DIRECT:
            return (ROUTE_MODELS[Route.DIRECT],)
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
