#!/usr/bin/env python3
"""Soak test: many concurrent native streams against a synthetic-engine service; every stream must
arrive whole, in order and exactly once. With --chaos: hostile and careless traffic instead.

The synthetic engine's tokens are a known function of the prompt (cpu_engine/synthetic.py
predict_tokens), so each request's text is predicted here and compared with what arrived:
  lost   - the request failed (status, transport error, timeout)
  short  - the text is a strict prefix of the expected one
  wrong  - anything else (duplicated, reordered or foreign tokens)
RSS of the service worker and of tritonserver + its stubs is reported before and after.

  python scripts/soak.py                                  # pack a synthetic model, serve, soak
  python scripts/soak.py --concurrency 200 --total 1000   # reduced (as the CI test runs it)
  python scripts/soak.py --url http://host:3000 --model trtllm-synthetic:latest
  python scripts/soak.py --chaos                          # 1000 hostile requests, Triton killed

--chaos mixes native and OpenAI requests, streamed and not, with clients that leave at random
moments, bodies over the size limit, malformed bodies and invalid fields, and SIGKILLs
tritonserver once, a third of the way through (loopback only: the server must run on this
machine); its clients try a 503 again after its Retry-After. It checks that every request that
was not cancelled completes with the predicted text or fails cleanly (a 502/504, a stream cut
with an error, a 503 still after 30 tries), that no client mistake gets a 5xx, that
nothing hangs, that the in-flight gauge is back to 0, and that the worker's RSS is back within
10% of what it was after a warm-up.

Exit status: 0 when nothing was lost, short or wrong within --deadline (--chaos: when every
check holds); 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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
    """`concurrency` clients, each with a connection of its own (kept alive, or new for each
    request), send `total` requests between them. One pool per client: a pool shared by all of
    them costs httpx more CPU per request than the service spends on it."""
    tally = Tally()
    indices = iter(range(total))
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1 if keepalive else 0)
    timeout = httpx.Timeout(request_timeout, connect=request_timeout)
    tls = ssl.create_default_context()  # loading the CA bundle is ~50 ms: once, not per client

    async def one(client: httpx.AsyncClient, index: int) -> None:
        prompt = f"soak request {index}"
        body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
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

    async def client_loop() -> None:
        async with httpx.AsyncClient(
            base_url=url, limits=limits, timeout=timeout, verify=tls
        ) as client:
            for index in indices:
                await one(client, index)

    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
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

    def __init__(
        self, model_tag: str, startup_timeout: float, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="soak-bentoml-", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bentoml", "serve", "service:TRTLLM",
             "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT, env={**os.environ, "TRTLLM_MODEL": model_tag, **(env or {})}, stdout=self.log,
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


# --- chaos: hostile and careless clients ----------------------------------------------------------

NORMAL_KINDS = ("stream", "text", "openai", "openai-stream")
MISTAKES = ("oversized", "malformed", "invalid")
# What a request may end as. The first four are fine; the rest fail the run.
FINE = ("ok", "cancelled", "refused", "failed-clean")
FAILURES = ("wrong", "short", "hung", "5xx-for-mistake", "mistake-accepted", "unexpected")
MAX_RETRIES = 30
CHAOS_BODY_LIMIT = 64 * 1024  # the body limit of the server the script starts for --chaos


class ChaosTally:
    """Requests by outcome, and the first few of each failure."""

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = dict.fromkeys(FINE + FAILURES, 0)
        self.examples: list[str] = []
        self.started = 0
        self.retries = 0

    def note(self, outcome: str, detail: str = "") -> None:
        self.outcomes[outcome] += 1
        if outcome in FAILURES and len(self.examples) < 10:
            self.examples.append(f"{outcome}: {detail}")

    @property
    def failed(self) -> int:
        return sum(self.outcomes[name] for name in FAILURES)


@dataclass
class ChaosClient:
    """Sends one request of a kind, leaves early when told to, and judges how it ended."""

    client: httpx.AsyncClient
    model: str
    predictor: Predictor
    body_limit: int
    tally: ChaosTally
    request_timeout: float

    def _body(self, kind: str, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
        native = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
        # OpenAI samples with a random seed by default, which the synthetic engine adds to its own.
        openai = {"model": self.model, "seed": 0, **native}
        return {
            "stream": ("/generate", native),
            "text": ("/generate_text", native),
            "openai": ("/v1/completions", openai),
            "openai-stream": ("/v1/completions", {**openai, "stream": True}),
        }[kind]

    async def one(self, index: int, kind: str, leave_after: float | None, rng: Any) -> None:
        if kind in MISTAKES:
            await self._mistake(index, kind, rng)
            return
        prompt = f"chaos request {index}"
        max_tokens = rng.randint(4, 48)
        path, body = self._body(kind, prompt, max_tokens)
        expected = self.predictor.expected(prompt, max_tokens)
        limit = leave_after if leave_after is not None else self.request_timeout
        try:
            outcome, detail = await asyncio.wait_for(
                self._retried(path, body, kind, expected), limit
            )
        except TimeoutError:
            outcome, detail = ("cancelled", "") if leave_after is not None else ("hung", path)
        self.tally.note(outcome, f"#{index} {kind} {path}: {detail}")

    async def _retried(
        self, path: str, body: dict[str, Any], kind: str, expected: str
    ) -> tuple[str, str]:
        """As a careful client: a 503 is tried again after its Retry-After (while Triton
        restarts), up to MAX_RETRIES times."""
        for _ in range(MAX_RETRIES):
            outcome, detail = await self._send(path, body, kind, expected)
            if outcome != "retry":
                return outcome, detail
            self.tally.retries += 1
            await asyncio.sleep(float(detail))
        return "failed-clean", f"still 503 after {MAX_RETRIES} tries"

    async def _send(
        self, path: str, body: dict[str, Any], kind: str, expected: str
    ) -> tuple[str, str]:
        streamed = kind in ("stream", "openai-stream")
        text = ""
        try:
            async with self.client.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    return self._failed_status(response)
                if not streamed:
                    payload = json.loads(await response.aread())
                    text = payload["text"] if kind == "text" else payload["choices"][0]["text"]
                    return _judge_text(expected, text, complete=True)
                if kind == "stream":
                    async for piece in response.aiter_text():
                        text += piece
                    return _judge_text(expected, text, complete=True)
                done = False
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: ") :]
                    if data == "[DONE]":
                        done = True
                        continue
                    event = json.loads(data)
                    if "error" in event:
                        return "failed-clean", f"error event: {event['error']}"
                    text += event["choices"][0]["text"] if event.get("choices") else ""
                return _judge_text(expected, text, complete=done)
        except (httpx.RemoteProtocolError, httpx.ReadError) as error:
            # A stream cut with a transport error: the client knows it is incomplete.
            if text and not expected.startswith(text):
                return "wrong", f"cut after a wrong text {text!r}"
            return "failed-clean", f"{type(error).__name__} after {len(text)} chars"
        except httpx.HTTPError as error:
            return "unexpected", f"{type(error).__name__}: {error}"

    @staticmethod
    def _failed_status(response: httpx.Response) -> tuple[str, str]:
        """("retry", seconds) for a 503 with Retry-After; a 502 or 504 is a clean failure."""
        status = response.status_code
        detail = f"HTTP {status} {response.text[:160]}"
        if status == 503 and "retry-after" in response.headers:
            return "retry", response.headers["retry-after"]
        if status in (502, 504):
            return "failed-clean", detail
        return "unexpected", detail

    async def _mistake(self, index: int, kind: str, rng: Any) -> None:
        path = rng.choice(
            ("/generate", "/generate_text", "/v1/completions", "/v1/chat/completions")
        )
        openai = path.startswith("/v1")
        base: dict[str, Any] = {"model": self.model} if openai else {}
        if path == "/v1/chat/completions":
            base["messages"] = [{"role": "user", "content": "hi"}]
        else:
            base["prompt"] = "hi"
        if kind == "oversized":
            content = json.dumps({**base, "stop": ["x" * (self.body_limit + 1024)]}).encode()
        elif kind == "malformed":
            content = json.dumps(base).encode()[: rng.randint(1, 12)]
        else:
            content = json.dumps({**base, "max_tokens": -rng.randint(1, 9)}).encode()
        try:
            response = await asyncio.wait_for(
                self.client.post(
                    path, content=content, headers={"content-type": "application/json"}
                ),
                self.request_timeout,
            )
        except TimeoutError:
            self.tally.note("hung", f"#{index} {kind} {path}")
            return
        except httpx.HTTPError as error:
            self.tally.note("unexpected", f"#{index} {kind} {path}: {type(error).__name__}")
            return
        status = response.status_code
        detail = f"#{index} {kind} {path}: HTTP {status} {response.text[:120]}"
        if 400 <= status < 500:
            self.tally.note("refused")
        elif status >= 500:
            self.tally.note("5xx-for-mistake", detail)
        else:
            self.tally.note("mistake-accepted", detail)


def _judge_text(expected: str, got: str, complete: bool) -> tuple[str, str]:
    if got in (expected, expected.rstrip("\ufffd")):
        return ("ok", "") if complete else ("short", "no [DONE] after the whole text")
    if expected.startswith(got):
        detail = f"{len(got)} of {len(expected)} chars"
        return ("short", detail) if complete else ("failed-clean", detail)
    return "wrong", f"expected {expected!r}, got {got!r}"


def in_flight(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = re.findall(r"^trtllm_requests_in_flight(?:\{[^}]*\})? (\S+)$", text, re.M)
    return sum(float(value) for value in values)


def wait_until(predicate: Any, timeout: float, interval: float = 0.2) -> float | None:
    """Seconds until predicate() held, or None if it did not within timeout."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if predicate():
                return time.monotonic() - started
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(interval)
    return None


def kill_tritonserver(server_pid: int) -> int | None:
    """SIGKILL the tritonserver under server_pid; its pid, or None if there was none."""
    _workers, tritons = service_processes(server_pid)
    for process in tritons:
        if "tritonserver" in _argv0(process):
            process.kill()
            return process.pid
    return None


async def run_chaos(
    url: str, predictor: Predictor, total: int, concurrency: int, body_limit: int,
    request_timeout: float, leave_share: float, server_pid: int, seed: int,
) -> tuple[ChaosTally, dict[str, Any]]:  # fmt: skip
    import random

    rng = random.Random(seed)
    tally = ChaosTally()
    facts: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(request_timeout, connect=request_timeout)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        chaos = ChaosClient(client, model, predictor, body_limit, tally, request_timeout)
        semaphore = asyncio.Semaphore(concurrency)
        third = asyncio.Event()

        async def one(index: int) -> None:
            kind = rng.choices(NORMAL_KINDS + MISTAKES, weights=(30, 20, 15, 20, 5, 5, 5))[0]
            leave = (
                rng.uniform(0.005, 0.3)
                if kind in NORMAL_KINDS and rng.random() < leave_share
                else None
            )
            async with semaphore:
                tally.started += 1
                if tally.started >= total // 3:
                    third.set()
                await chaos.one(index, kind, leave, rng)

        async def killer() -> None:
            await third.wait()
            facts["killed_pid"] = kill_tritonserver(server_pid)
            facts["killed_at"] = time.monotonic()

        killing = asyncio.ensure_future(killer())
        await asyncio.gather(*(one(i) for i in range(total)))
        await killing
    return tally, facts


def chaos_main(args: argparse.Namespace) -> int:
    model = args.model or pack_synthetic(args.itl_ms, args.max_batch_size)
    predictor = Predictor(model)
    body_limit = args.body_limit or (CHAOS_BODY_LIMIT if not args.url else 4 * 1024 * 1024)
    own = None
    if not args.url:
        env = {"TRTLLM_MAX_REQUEST_BYTES": str(body_limit)}
        own = OwnServer(model, args.startup_timeout, env)
    url = args.url or own.url  # type: ignore[union-attr]
    rows: list[tuple[str, str]] = [("model", model), ("url", url)]
    failures: list[str] = []
    try:
        server_pid = own.process.pid if own else find_server_pid(url)
        if server_pid is None:
            raise SystemExit(f"no process listens on {url}: --chaos needs a server on this machine")
        workers, _ = service_processes(server_pid)
        # Warm-up: imports, caches and pools of a fresh worker are not growth.
        asyncio.run(run_load(url, predictor, 200, 50, 16, args.request_timeout))
        time.sleep(1.0)
        rss_start = rss_mib(workers)
        started = time.monotonic()
        try:
            tally, facts = asyncio.run(
                asyncio.wait_for(
                    run_chaos(
                        url,
                        predictor,
                        args.total,
                        args.concurrency,
                        body_limit,
                        args.request_timeout,
                        args.leave_share,
                        server_pid,
                        args.seed,
                    ),  # fmt: skip
                    args.deadline,
                )
            )
        except TimeoutError:
            raise SystemExit(
                f"SOAK FAILED: the chaos run did not end within {args.deadline} s"
            ) from None
        elapsed = time.monotonic() - started
        if facts.get("killed_pid") is None:
            failures.append("no tritonserver was found to kill")
        ready_after = wait_until(
            lambda: httpx.get(f"{url}/readyz", timeout=3).status_code == 200, 120
        )
        if ready_after is None:
            failures.append("the service did not become ready again within 120 s")
        settled_after = wait_until(lambda: in_flight(url) == 0, 10)
        if settled_after is None:
            failures.append(
                f"trtllm_requests_in_flight is {in_flight(url)}, not 0, 10 s after the run"
            )
        time.sleep(2.0)
        rss_end = rss_mib(workers)
        growth = (rss_end - rss_start) / rss_start if rss_start else 0.0
        if abs(growth) > 0.10:
            failures.append(f"worker RSS {rss_start:.0f} -> {rss_end:.0f} MiB ({growth:+.0%})")
    finally:
        if own is not None:
            own.stop()
    if tally.failed:
        failures.append(f"{tally.failed} request(s) ended badly")
    rows += [
        ("requests", f"{args.total} ({args.concurrency} concurrent, {args.leave_share:.0%} of the "
                     "normal ones leave early)"),
        ("elapsed", f"{elapsed:.1f} s"),
        ("tritonserver killed", f"pid {facts.get('killed_pid')} after {args.total // 3} requests"),
        ("503s tried again", str(tally.retries)),
        ("ready again after the run", "no" if ready_after is None else f"{ready_after:.1f} s"),
        ("in flight after the run", "0" if settled_after is not None else "not 0"),
        ("worker RSS MiB after warm-up/after", f"{rss_start:.0f} / {rss_end:.0f} ({growth:+.1%})"),
        *((name, str(tally.outcomes[name])) for name in FINE + FAILURES),
    ]  # fmt: skip
    print_table(rows)
    for example in tally.examples + failures:
        print(example)
    print("SOAK FAILED" if failures else "SOAK OK")
    return 1 if failures else 0


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
    parser.add_argument("--concurrency", type=int, help="default: 1000 (--chaos: 100)")
    parser.add_argument("--total", type=int, help="default: 10000 (--chaos: 1000)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--itl-ms", type=float, default=2.0, help="when packing a model")
    parser.add_argument("--max-batch-size", type=int, default=256, help="when packing a model")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds for the load")
    parser.add_argument("--request-timeout", type=float, default=300.0)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument(
        "--no-keepalive", action="store_true", help="a new connection per request (diagnosis)"
    )
    chaos = parser.add_argument_group("--chaos")
    chaos.add_argument("--chaos", action="store_true", help="hostile traffic, Triton killed once")
    chaos.add_argument(
        "--leave-share",
        type=float,
        default=0.25,
        help="share of normal requests whose client leaves at a random moment",
    )
    chaos.add_argument("--body-limit", type=int,
                       help="the server's TRTLLM_MAX_REQUEST_BYTES (default: 64 KiB for the "
                            "server started here, 4 MiB with --url)")  # fmt: skip
    chaos.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.url and not args.model:
        parser.error("--url needs --model (to predict the synthetic engine's output)")
    if args.chaos:
        args.total = args.total or 1000
        args.concurrency = args.concurrency or 100
        return chaos_main(args)
    args.total = args.total or 10_000
    args.concurrency = args.concurrency or 1000

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
