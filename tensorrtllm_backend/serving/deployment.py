"""Deployment-time choices made when service.py is imported: which stored model to serve, what
resources to ask BentoML / BentoCloud for, the one step of the Bento's image that bentofile.yaml
cannot express, the HTTP server's keep-alive timeout and its error log."""

from __future__ import annotations

import atexit
import functools
import gc
import logging
import os
import shutil
import signal
import tempfile
from typing import Any

import bentoml

from ..common.model_store import FORMAT
from ..settings import PORT_ENVS, SHARED_DIR_ENV, env_name, load_settings
from ..triton.command import find_free_port
from .apis import streaming_paths
from .parent_watch import is_bentoml_serve

DEFAULT_MODEL = "trtllm-demo:latest"


def model_tag() -> str:
    """$TRTLLM_MODEL; else the only packed model in the store (as inside a built Bento); else
    the demo model."""
    explicit = load_settings().model
    if explicit:
        return explicit
    names = {
        model.tag.name
        for model in bentoml.models.list()
        if model.info.metadata.get("format") == FORMAT
    }
    return f"{names.pop()}:latest" if len(names) == 1 else DEFAULT_MODEL


def resources(tag: str) -> dict[str, Any]:
    """One GPU per rank for TensorRT-LLM engines; the CPU engine needs none."""
    try:
        metadata = bentoml.models.get(tag).info.metadata
    except bentoml.exceptions.NotFound:
        return {"cpu": "2"}
    if metadata.get("engine_kind") == "cpu":
        return {"cpu": "2"}
    requested: dict[str, Any] = {"gpu": int(metadata.get("engine_world_size", 1))}
    gpu_type = load_settings().gpu_type  # BentoCloud names, e.g. nvidia-l4, nvidia-a100-80gb
    if gpu_type:
        requested["gpu_type"] = gpu_type
    return requested


# What the Bento's image writes down before installing its requirements: every package of the
# base image (for the post-install check), and those of TensorRT-LLM's stack as pip constraints
# (bentofile.yaml's envs point UV_CONSTRAINT there).
IMAGE_PACKAGES = "/app/image-packages.txt"
IMAGE_CONSTRAINTS = "/app/image-constraints.txt"
# The stack the Bento's requirements must never change: the engine, torch, xgrammar and what
# they are compiled against. Other packages of the image stay as they are unless a requirement
# needs a newer release (uv keeps what satisfies); pinning them all would make a build fail on
# NVIDIA's images over packages the service does not share with the engine (e.g. BentoML needs
# an fsspec newer than the one TensorRT-LLM's `datasets` pin allows).
IMAGE_STACK = (
    r"tensorrt|tensorrt[-_.].*|torch|torch[-_.].*|torchvision|torchaudio|xgrammar"
    r"|apache[-_.]tvm[-_.]ffi|numpy|triton|nvidia[-_.].*|cuda[-_.].*|flashinfer[-_.]python"
)
# Installed distributions whose version is a release number (PEP 440; distro packages with
# versions like 2.7.7ubuntu4 cannot be pinned and are left out).
FREEZE_BASE_IMAGE = (
    "mkdir -p /app && python3 -m pip list --format=freeze --disable-pip-version-check"
    " | grep -E '^[A-Za-z0-9._-]+==[0-9]+(\\.[0-9]+)*((a|b|rc)[0-9]+)?(\\.post[0-9]+)?"
    f"(\\.dev[0-9]+)?(\\+[A-Za-z0-9.]+)?$' > {IMAGE_PACKAGES}"
    f"; grep -iE '^({IMAGE_STACK})==' {IMAGE_PACKAGES} > {IMAGE_CONSTRAINTS}"
    f"; wc -l {IMAGE_PACKAGES} {IMAGE_CONSTRAINTS}"
)


def bento_image() -> bentoml.images.Image:
    """The Bento's image, as far as bentofile.yaml cannot say it: before BentoML installs
    requirements-bento.txt, the base image's packages are written down, its TensorRT-LLM stack
    as constraints.

    bentofile.yaml gives the rest: the base image, its Python (`uv venv` uses it), the
    requirements, the post-install step and the uv settings that install into the image's own
    Python (UV_SYSTEM_PYTHON) under these constraints (UV_CONSTRAINT). BentoML runs an `Image`'s
    commands before the requirements and bentofile.yaml's `setup_script` after them; a step
    before them exists only here. BentoML (1.4.39) applies bentofile.yaml onto this image with
    `attrs.evolve`, which adds its default apt-get step a second time: the first copy is dropped
    here.
    """
    image = bentoml.images.Image(lock_python_packages=False)
    image.commands.clear()
    return image.run(FREEZE_BASE_IMAGE)


REQUEST_TIMEOUT_S = 600


def traffic(tag: str) -> dict[str, Any]:
    """BentoML's traffic settings: the request timeout, and the concurrency one replica is sized
    for.

    `concurrency` is what BentoCloud's autoscaler compares with the requests in flight per
    replica. TRTLLM_CONCURRENCY sets it; by default it is the engine's max_batch_size, the
    sequences it decodes at once (requests beyond that wait in Triton's queue and only add
    latency). TRTLLM_EXTERNAL_QUEUE=1 holds requests beyond `concurrency` in BentoCloud's queue
    instead of sending them to a busy replica (it needs `concurrency`). The in-flight bound of
    one worker is GuardMiddleware's (TRTLLM_MAX_IN_FLIGHT: 429 + Retry-After)."""
    env = load_settings()
    settings: dict[str, Any] = {"timeout": REQUEST_TIMEOUT_S}
    concurrency = env.concurrency
    if concurrency is None:
        try:
            metadata = bentoml.models.get(tag).info.metadata
        except bentoml.exceptions.NotFound:
            metadata = {}
        batch = metadata.get("engine_max_batch_size")
        concurrency = int(batch) if isinstance(batch, int) and batch > 0 else None
    if concurrency is not None:
        settings["concurrency"] = concurrency
    if env.external_queue:
        if concurrency is None:
            raise ValueError("TRTLLM_EXTERNAL_QUEUE=1 needs TRTLLM_CONCURRENCY")
        settings["external_queue"] = True
    return settings


def tracing_config() -> dict[str, Any]:
    """OpenTelemetry's ASGI middleware opens a span for every HTTP body message, i.e. per streamed
    chunk: that costs ~10% of the serving CPU. The APIs whose answers stream (the registry's
    `streams`) are left out of tracing unless TRTLLM_TRACE_STREAMS=1."""
    if load_settings().trace_streams:
        return {}
    return {"excluded_urls": streaming_paths()}


_UVICORN_DEFAULT_KEEP_ALIVE_S = 5  # also what `bentoml serve` passes when not told otherwise


def lengthen_keep_alive() -> None:
    """Serve idle keep-alive connections for 75 s (TRTLLM_HTTP_KEEPALIVE_S) instead of 5 s.

    A server that closes an idle connection at the moment a client reuses it resets the client's
    next request, which never reaches the service (for a POST, clients do not retry). uvicorn's
    5 s equals httpx's default pool expiry, so under load httpx clients lost a few requests in a
    thousand; a server timeout above its clients' (httpx 5 s, aiohttp 15 s, load balancers
    ~60 s) closes that race. BentoML sets the value only through a hidden `bentoml serve` flag,
    which BentoCloud's serve command does not pass, so the default is raised where uvicorn
    reads it; an explicit `--timeout-keep-alive` other than 5 is kept.
    """
    import uvicorn

    original = uvicorn.Config.__init__
    if getattr(original, "_trtllm_keep_alive", False):
        return
    timeout = load_settings().http_keepalive_s

    @functools.wraps(original)
    def init(self: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("timeout_keep_alive", _UVICORN_DEFAULT_KEEP_ALIVE_S) == (
            _UVICORN_DEFAULT_KEEP_ALIVE_S
        ):
            kwargs["timeout_keep_alive"] = timeout
        original(self, *args, **kwargs)

    init._trtllm_keep_alive = True  # type: ignore[attr-defined]
    uvicorn.Config.__init__ = init  # type: ignore[method-assign]


def log_server_errors_once() -> None:
    """Print each of the HTTP server's errors once.

    BentoML 1.4's server logging gives `uvicorn.error` a handler and also lets it propagate to
    the root logger, which has the same handler: a failed startup's traceback and "Application
    startup failed" appeared twice, at every restart. Propagation is turned off only in exactly
    that case, so the records still reach the shared handler once.
    """
    server_errors = logging.getLogger("uvicorn.error")
    shared = set(server_errors.handlers) & set(logging.getLogger().handlers)
    if server_errors.propagate and shared:
        server_errors.propagate = False


def settle_workers() -> int:
    """The number of HTTP workers (TRTLLM_WORKERS, or the host's default), written to the
    environment so that every worker, which reads its settings itself, counts the same."""
    workers = load_settings().workers
    os.environ[env_name("workers")] = str(workers)
    return workers


def share_triton_ports(workers: int) -> None:
    """Fix tritonserver's loopback ports, and a directory for its lock, for workers that share it
    (see `sharing`).

    `bentoml serve` imports service.py before it starts the workers, which inherit its
    environment: what is chosen here is the same in every worker. Ports set by the user are kept.
    The directory goes when the process that made it exits.
    """
    if workers <= 1:
        return
    taken = {os.environ[name] for name in PORT_ENVS if os.environ.get(name)}
    for name in PORT_ENVS:
        if os.environ.get(name):
            continue
        port = str(find_free_port())
        while port in taken:
            port = str(find_free_port())
        taken.add(port)
        os.environ[name] = port
    if not os.environ.get(SHARED_DIR_ENV):
        directory = tempfile.mkdtemp(prefix="trtllm-workers-")
        os.environ[SHARED_DIR_ENV] = directory
        atexit.register(shutil.rmtree, directory, True)


def freeze_startup_heap() -> None:
    """Keep the garbage collector off what start-up loaded: once, when the service is ready.

    The worker starts with ~430k tracked objects (BentoML, transformers, the tokenizer) that live
    as long as it does. Requests in flight survive young collections, so full collections come
    every few hundred requests, and each walked that whole heap: ~200 ms with every stream
    stalled, ~280 µs of CPU per 1-token request on average. Frozen objects are skipped; a full
    collection then walks only what requests left (docs/streaming-path.md, "The start-up heap,
    frozen").
    """
    gc.collect()  # start-up's own garbage goes first: frozen objects are never freed
    gc.freeze()


def end_serving(reason: BaseException) -> None:
    """Stop `bentoml serve` altogether after a start that cannot succeed.

    Outside containers BentoML's process manager starts a worker again whenever it exits, also
    when its startup failed: a model that cannot import would be loaded every ~10 s, forever,
    and the error scroll by. The failing worker asks its parent, the `bentoml serve` process,
    to shut down (SIGTERM, as Ctrl-C would), so the start ends with the reason in the log.
    """
    parent = os.getppid()
    if not is_bentoml_serve(parent):
        return  # not started by `bentoml serve` (a test harness, a notebook): leave it alone
    logging.getLogger("bentoml.trtllm").error(
        "the service cannot start, stopping `bentoml serve` (pid %d): %s", parent, reason
    )
    os.kill(parent, signal.SIGTERM)
