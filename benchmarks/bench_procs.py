"""Processes a benchmark run owns: pack_model runs, `bentoml serve` services and the directly
supervised tritonserver. Everything started here is registered and stopped by :meth:`close`,
also on Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from tensorrtllm_backend.settings import load_settings
from tensorrtllm_backend.triton.command import TritonServerConfig, find_free_port
from tensorrtllm_backend.triton.localize import localize_repository
from tensorrtllm_backend.triton.supervisor import TritonSupervisor

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent


def run_record(benchmark: str, args: argparse.Namespace) -> dict[str, object]:
    """What every result file starts with: the benchmark, when and on what host it ran, and its
    settings (the parsed command line)."""
    return {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }


def write_result(result: dict[str, object], path: Path | None, prefix: str) -> Path:
    """The run's JSON at `path`, or benchmarks/results/<prefix>-<time>.json."""
    path = path or BENCH_DIR / "results" / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return path


def synthetic_parser(doc: str | None, requests: int, requests_help: str) -> argparse.ArgumentParser:
    """The command line of a benchmark that serves the synthetic engine itself, with the options
    they all take: the engine's inter-token latency, the requests, output tokens per request and
    the result file."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--itl-ms", type=float, default=20.0, help="synthetic inter-token latency")
    parser.add_argument("--requests", type=int, default=requests, help=requests_help)
    parser.add_argument("--max-tokens", type=int, default=100, help="output tokens per request")
    parser.add_argument("--json", type=Path, help="result file (default benchmarks/results/...)")
    return parser


def save_result(
    args: argparse.Namespace, measured: dict[str, object], started: float, prefix: str
) -> Path:
    """The run's settings, what it measured and how long it took, written by write_result."""
    result = {"settings": vars(args), **measured, "duration_s": time.perf_counter() - started}
    path = write_result(result, args.json, prefix)
    print(f"\nwrote {path} ({result['duration_s']:.0f} s)")
    return path


class BenchSetupError(RuntimeError):
    """A process the benchmark needs did not start; the message carries its log tail."""


@dataclass
class PackedModel:
    tag: str
    root: Path  # the stored model's directory
    pack_s: float


@dataclass
class Service:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    cold_start_s: float
    spawned_at: float = 0.0
    triton_grpc_url: str | None = None  # the service's own tritonserver, when its port is known

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def serving_cpu_s(self) -> float:
        """CPU seconds used so far by `bentoml serve` and its workers, not by the tritonserver
        it supervises (nor that server's Python stubs): the serving layer's own cost."""
        total = 0.0
        try:
            root = psutil.Process(self.process.pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return total
        triton = {p.pid for p in processes if _is_triton(p)}
        for process in processes:
            with contextlib.suppress(psutil.Error):
                if process.pid in triton or triton & {a.pid for a in process.parents()}:
                    continue
                times = process.cpu_times()
                total += times.user + times.system
        return total


def own_cpu_s() -> float:
    """CPU seconds of this process (the load generator, or a bare client measured here)."""
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


def _is_triton(process: psutil.Process) -> bool:
    try:
        return process.name().startswith(("tritonserver", "mpirun"))
    except psutil.Error:
        return False


def _log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class Processes:
    """Owner of every process of one run; use as a context manager."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.bentoml_home = work_dir / "bentoml"
        self.logs = work_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._services: list[tuple[Service, list[psutil.Process]]] = []
        self._supervisors: list[TritonSupervisor] = []

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "BENTOML_HOME": str(self.bentoml_home),
            "BENTOML_DO_NOT_TRACK": "true",
            "HF_HUB_OFFLINE": "1",
            **extra,
        }

    # -- pack_model ---------------------------------------------------------------------------
    def pack(self, *args: str, name: str, root: Path = ROOT) -> PackedModel:
        """Run pack_model.py as the CLI it is (imports included in the time); `root`: the
        checkout whose pack_model.py runs."""
        log_path = self.logs / f"pack-{name}.log"
        started = time.perf_counter()
        with log_path.open("wb") as log:
            code = subprocess.call(
                [sys.executable, str(root / "pack_model.py"), *args, "--name", name,
                 "--no-progress"],
                cwd=root, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        elapsed = time.perf_counter() - started
        output = _log_tail(log_path)
        match = re.search(r"^stored: (\S+)$", output, re.MULTILINE)
        if code != 0 or match is None:
            raise BenchSetupError(f"pack_model {' '.join(args)} failed ({code}):\n{output}")
        tag = match.group(1)
        model_name, version = tag.split(":", 1)
        return PackedModel(tag, self.bentoml_home / "models" / model_name / version, elapsed)

    def pack_synthetic(
        self, name: str, *, itl_ms: float, max_batch_size: int, max_tokens: int,
        ttft_ms: float = 0.0, workflow: str = "engine", stream_interval: int = 1,
    ) -> PackedModel:  # fmt: skip
        """A synthetic-engine model for one ITL, with room for max_tokens after any prompt of
        the benchmark's workload; `workflow` llmapi: the same engine behind the llmapi model;
        `stream_interval`: tokens per streamed engine response after the first."""
        interval = ["--fill", f"stream_interval={stream_interval}"] if stream_interval > 1 else []
        if interval and workflow == "llmapi":
            interval = ["--llm-arg", f"stream_interval={stream_interval}"]
        suffix = f"-si{stream_interval}" if interval else ""
        return self.pack(
            "--synthetic", "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
            "--max-batch-size", str(max_batch_size),
            "--max-seq-len", str(max(2048, max_tokens + 1100)), "--workflow", workflow, *interval,
            name=f"{name}{'' if workflow == 'engine' else '-' + workflow}-itl{itl_ms:g}{suffix}"
            .replace(".", "p"),
        )  # fmt: skip

    # -- tritonserver through the project's supervisor -------------------------------------------
    def start_triton(self, model: PackedModel, label: str) -> TritonSupervisor:
        repository = localize_repository(
            model.root / "model_repository", self.work_dir / f"repo-{label}", model.root,
            engine_instances=load_settings().engine_instances,
        )  # fmt: skip
        supervisor = TritonSupervisor(
            TritonServerConfig(
                model_repository=repository, log_dir=self.logs / f"triton-{label}", restart=False,
                startup_timeout_s=180.0,
            )
        )  # fmt: skip
        self._supervisors.append(supervisor)
        supervisor.start()
        return supervisor

    def stop_triton(self, supervisor: TritonSupervisor) -> None:
        supervisor.stop()
        with contextlib.suppress(ValueError):
            self._supervisors.remove(supervisor)

    # -- bentoml serve --------------------------------------------------------------------------
    def start_service(
        self, name: str, target: str, cwd: Path, env: dict[str, str], timeout_s: float = 240.0
    ) -> Service:
        """`bentoml serve target` on a free port; returns once /readyz is 200 (cold start)."""
        service = self.spawn_service(name, target, cwd, env)
        self.wait_ready(service, timeout_s)
        return service

    def spawn_service(self, name: str, target: str, cwd: Path, env: dict[str, str]) -> Service:
        """Start `bentoml serve target` without waiting (see wait_ready)."""
        port = find_free_port()
        log_path = self.logs / f"serve-{name}-{port}.log"
        started = time.perf_counter()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "bentoml", "serve", target, "--host", "127.0.0.1",
                 "--port", str(port)],
                cwd=cwd, env=self.env(**env), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        service = Service(name, f"http://127.0.0.1:{port}", process, log_path, 0.0, started)
        self._services.append((service, []))
        return service

    def wait_ready(self, service: Service, timeout_s: float = 240.0) -> None:
        """Block until /readyz is 200; cold_start_s is measured from the spawn."""
        deadline = service.spawned_at + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.perf_counter() < deadline:
                if service.process.poll() is not None:
                    raise BenchSetupError(
                        f"{service.name}: bentoml serve exited:\n{service.log_tail()}"
                    )
                try:
                    if client.get(f"{service.url}/readyz").status_code == 200:
                        service.cold_start_s = time.perf_counter() - service.spawned_at
                        self._remember_children(service)
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        raise BenchSetupError(
            f"{service.name}: not ready after {timeout_s:.0f} s:\n{service.log_tail()}"
        )

    def wait_workers(self, service: Service, workers: int, timeout_s: float = 120.0) -> None:
        """/readyz answers once one worker is up. Connections made before the others are would
        all stay on that one (keep-alive), so wait for every worker's start-up hook."""
        deadline = time.perf_counter() + timeout_s
        while service.log_tail(10**7).count("Completed async startup hook") < workers:
            if time.perf_counter() > deadline:
                raise BenchSetupError(
                    f"{service.name}: {workers} workers not up after {timeout_s:.0f} s:\n"
                    f"{service.log_tail()}"
                )
            time.sleep(0.2)
        self._remember_children(service)

    def _remember_children(self, service: Service) -> None:
        """Descendants (worker, tritonserver, python stubs) to reap if a graceful stop fails."""
        for index, (known, _) in enumerate(self._services):
            if known is service:
                with contextlib.suppress(psutil.Error):
                    children = psutil.Process(service.process.pid).children(recursive=True)
                    self._services[index] = (service, children)

    def stop_service(self, service: Service, timeout_s: float = 30.0) -> None:
        for index, (known, children) in enumerate(self._services):
            if known is service:
                del self._services[index]
                _stop_group(service.process, children, timeout_s)
                return

    def close(self) -> None:
        while self._services:
            service, children = self._services.pop()
            _stop_group(service.process, children, 30.0)
        while self._supervisors:
            self._supervisors.pop().stop()


def _stop_group(
    process: subprocess.Popen[bytes], children: list[psutil.Process], timeout_s: float
) -> None:
    """SIGTERM the process group (bentoml stops its tritonserver), SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:  # e.g. a tritonserver in its own session that outlived the service
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=5)
