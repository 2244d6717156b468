#!/usr/bin/env python3
"""Soak test: many concurrent native streams against a synthetic-engine service; every stream must
arrive whole, in order and exactly once.

The synthetic engine's tokens are a known function of the prompt (cpu_engine/synthetic.py
predict_tokens), so each request's text is predicted here and compared with what arrived:
  lost   - the request failed (status, transport error, timeout)
  short  - the text is a strict prefix of the expected one
  wrong  - anything else (duplicated, reordered or foreign tokens)
RSS of the service worker and of tritonserver + its stubs is reported before and after.

  python scripts/soak.py                                  # pack a synthetic model, serve, soak
  python scripts/soak.py --concurrency 200 --total 1000   # reduced (as the CI test runs it)
  python scripts/soak.py --url http://host:3000 --model trtllm-synthetic:latest

Exit status: 0 when nothing was lost, short or wrong within --deadline; 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import psutil  # noqa: E402


class Tally:
    """Requests by outcome (ok, lost, short, wrong), chunks received, the first few failures."""

    def __init__(self) -> None:
        self.ok = self.lost = self.short = self.wrong = self.chunks = 0
        self.examples: list[str] = []

    def note(self, kind: str, detail: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.examples) < 5:
            self.examples.append(f"{kind}: {detail}")


class Predictor:
    """Expected text per prompt, from the stored model's tokenizer and engine config."""

    def __init__(self, model_tag: str) -> None:
        import bentoml

        from tensorrtllm_backend.common.tokenization import load_tokenizer

        root = Path(bentoml.models.get(model_tag).path)
        config = json.loads((root / "engines" / "config.json").read_text())
        engine = config["cpu_engine"]
        if engine.get("mode") != "synthetic":
            raise SystemExit(f"{model_tag} is not a synthetic-engine model: outputs are unknown")
        self.vocab_size = int(config["pretrained_config"]["vocab_size"])
        self.eos = int(engine.get("eos_token_id", 2))
        self.seed = int(engine.get("seed", 0))
        self.tokenizer = load_tokenizer(root / "tokenizer")

    def expected(self, prompt: str, max_tokens: int) -> str:
        from tensorrtllm_backend.python_models.cpu_engine.synthetic import predict_tokens

        ids = self.tokenizer.encode(prompt)
        tokens = predict_tokens(
            ids, max_tokens, vocab_size=self.vocab_size, eos_token_id=self.eos, seed=self.seed
        )
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))


def judge(tally: Tally, expected: str, got: str, index: int) -> None:
    # A trailing partial character may be held back (see IncrementalDetokenizer).
    if got in (expected, expected.rstrip("\ufffd")):
        tally.ok += 1
    elif expected.startswith(got):
        tally.note("short", f"#{index}: {len(got)} of {len(expected)} chars")
    else:
        tally.note("wrong", f"#{index}: expected {expected!r}, got {got!r}")


async def run_load(
    url: str, predictor: Predictor, total: int, concurrency: int, max_tokens: int,
    request_timeout: float, keepalive: bool = True,
) -> Tally:  # fmt: skip
    tally = Tally()
    semaphore = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(
        max_connections=concurrency, max_keepalive_connections=concurrency if keepalive else 0
    )
    timeout = httpx.Timeout(request_timeout, connect=request_timeout)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:

        async def one(index: int) -> None:
            prompt = f"soak request {index}"
            body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
            async with semaphore:
                parts: list[str] = []
                try:
                    async with client.stream("POST", "/generate", json=body) as response:
                        if response.status_code != 200:
                            await response.aread()
                            tally.note("lost", f"#{index}: HTTP {response.status_code} "
                                               f"{response.text[:200]}")  # fmt: skip
                            return
                        async for text in response.aiter_text():
                            parts.append(text)
                            tally.chunks += 1
                except (httpx.HTTPError, OSError) as error:
                    tally.note("lost", f"#{index}: {type(error).__name__}: {error}")
                    return
            judge(tally, predictor.expected(prompt, max_tokens), "".join(parts), index)

        await asyncio.gather(*(one(i) for i in range(total)))
    return tally


# --- processes and memory -------------------------------------------------------------------------


def service_processes(server_pid: int) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(bentoml worker(s) owning a tritonserver, tritonserver + stubs) under server_pid."""
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return [], []
    tritons = [p for p in children if _is_triton(p)]
    workers = {p.parent().pid: p.parent() for p in tritons if "tritonserver" in _argv0(p)}
    return list(workers.values()), tritons


def find_server_pid(url: str) -> int | None:
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    for connection in psutil.net_connections(kind="inet"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port:
            return connection.pid
    return None


def _argv0(process: psutil.Process) -> str:
    try:
        return (process.cmdline() or [""])[0]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def _is_triton(process: psutil.Process) -> bool:
    name = _argv0(process)
    return "tritonserver" in name or "triton_python_backend_stub" in name


def rss_mib(processes: list[psutil.Process]) -> float:
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def memory(server_pid: int | None) -> dict[str, float]:
    if server_pid is None:
        return {}
    workers, tritons = service_processes(server_pid)
    return {"worker": rss_mib(workers), "triton": rss_mib(tritons)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OwnServer:
    """A `bentoml serve` started (and always stopped) by this script."""

    def __init__(self, model_tag: str, startup_timeout: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="soak-bentoml-", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bentoml", "serve", "service:TRTLLM",
             "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT, env={**os.environ, "TRTLLM_MODEL": model_tag}, stdout=self.log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise SystemExit(f"bentoml serve exited; see {self.log.name}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise SystemExit(f"bentoml serve not ready after {startup_timeout}s; see {self.log.name}")

    def stop(self) -> None:
        try:
            started = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            started = []
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        _gone, alive = psutil.wait_procs(started, timeout=15)
        for process in alive:  # the worker has its own process group
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass


def pack_synthetic(itl_ms: float, max_batch_size: int) -> str:
    import pack_model

    args = pack_model.build_parser().parse_args([
        "--synthetic", "--name", "trtllm-soak", "--itl-ms", str(itl_ms),
        "--max-batch-size", str(max_batch_size), "--max-input-len", "64", "--max-seq-len", "512",
        "--no-progress",
    ])  # fmt: skip
    tag = pack_model.run(args)
    if tag is None:
        raise SystemExit("packing the synthetic model failed")
    return tag


def print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    print("-" * (width + 20))
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print("-" * (width + 20))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an already running service (default: start one)")
    parser.add_argument(
        "--model", help="model-store tag of the synthetic model (default: pack one)"
    )
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--total", type=int, default=10_000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--itl-ms", type=float, default=2.0, help="when packing a model")
    parser.add_argument("--max-batch-size", type=int, default=256, help="when packing a model")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds for the load")
    parser.add_argument("--request-timeout", type=float, default=300.0)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument(
        "--no-keepalive", action="store_true", help="a new connection per request (diagnosis)"
    )
    args = parser.parse_args(argv)
    if args.url and not args.model:
        parser.error("--url needs --model (to predict the synthetic engine's output)")

    model = args.model or pack_synthetic(args.itl_ms, args.max_batch_size)
    predictor = Predictor(model)
    own = None if args.url else OwnServer(model, args.startup_timeout)
    url = args.url or own.url  # type: ignore[union-attr]
    try:
        server_pid = own.process.pid if own else find_server_pid(url)
        before = memory(server_pid)
        started = time.monotonic()
        timed_out = False
        try:
            tally = asyncio.run(
                asyncio.wait_for(
                    run_load(
                        url,
                        predictor,
                        args.total,
                        args.concurrency,
                        args.max_tokens,
                        args.request_timeout,
                        not args.no_keepalive,
                    ),  # fmt: skip
                    args.deadline,
                )
            )
        except TimeoutError:
            timed_out, tally = True, Tally()
        elapsed = time.monotonic() - started
        after = memory(server_pid)
    finally:
        if own is not None:
            own.stop()

    rows: list[tuple[str, Any]] = [
        ("model", model),
        ("requests", f"{args.total} ({args.concurrency} concurrent, {args.max_tokens} tokens)"),
        ("elapsed", f"{elapsed:.1f} s" + (" (DEADLINE EXCEEDED)" if timed_out else "")),
        ("requests/s", f"{args.total / elapsed:.0f}"),
        ("tokens/s", f"{args.total * args.max_tokens / elapsed:.0f}"),
        ("chunks received", str(tally.chunks)),
        ("ok", str(tally.ok)),
        ("lost", str(tally.lost)),
        ("short", str(tally.short)),
        ("duplicated/reordered", str(tally.wrong)),
    ]
    for part in ("worker", "triton"):
        if part in before:
            rows.append((f"RSS {part} MiB before/after",
                         f"{before[part]:.0f} / {after.get(part, 0):.0f}"))  # fmt: skip
    print_table(rows)
    for example in tally.examples:
        print(example)
    failed = timed_out or tally.lost or tally.short or tally.wrong or tally.ok != args.total
    print("SOAK FAILED" if failed else "SOAK OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
