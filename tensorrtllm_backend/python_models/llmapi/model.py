"""TritonPythonModel of the llmapi workflow: one engine, an asyncio loop on a thread of its own.

`execute()` parses each request (a bad one gets its error at once) and schedules one task per
request on the loop, which starts it on the engine and sends a response per step as it comes
(decoupled), or hands the last one back to `execute()` (not decoupled). A thread looks every
`cancellation_check_period_ms` for requests whose client went away and aborts them; `stop` =
true aborts those with the same request id. An error of one request is that request's error:
the model and the other requests carry on.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

from ..cpu_engine.triton_metrics import MetricsPublisher
from ..request_error import RequestError
from ..stub_guard import start_orphan_guard, stop_orphan_guard
from ..stub_settings import cpu_engine_grace_s, llmapi_impl
from .engine import Generation, LlmEngine, Step
from .settings import ModelSettings, read_model_settings
from .tensors import (
    ParsedRequest,
    is_stop_request,
    load_image_urls,
    parse_request,
    text_response,
    token_response,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def make_engine(settings: ModelSettings, version_dir: Path) -> LlmEngine:
    """tensorrt_llm.LLM where it is importable (or TRTLLM_LLMAPI_IMPL=tensorrt_llm), the CPU
    stand-in otherwise (or TRTLLM_LLMAPI_IMPL=cpu)."""
    impl = llmapi_impl()
    if impl == "tensorrt_llm" or (
        impl == "auto" and importlib.util.find_spec("tensorrt_llm") is not None
    ):
        from .trtllm import TrtllmEngine

        return TrtllmEngine(settings)
    from .cpu import CpuEngine

    return CpuEngine(settings, version_dir)


class _Responder:
    """Where one request's responses go: its response sender (decoupled), or the one response
    execute() returns.

    Sending (the loop's thread) and asking whether the client went away (the cancellation
    watcher's) take one lock, and nothing is asked once the final response went out: Triton
    releases a request's response factory with its final response, and asking it afterwards
    crashes tritonserver (2.51: a segfault in TRITONBACKEND_ResponseFactoryIsCancelled).
    """

    def __init__(self, request: Any, decoupled: bool) -> None:
        self._sender = request.get_response_sender() if decoupled else None
        self._request = request
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.response: Any = None
        self.client_gone = False
        self.closed = False

    def send(self, response: Any, final: bool, tensors: list[Any] | None = None) -> None:
        """Send `response` (None: the flags alone); `tensors` are the response's, referenced
        here until the send returns (see tensors.Outgoing)."""
        with self._lock:
            if self.closed:
                return
            if final:
                self.closed = True
            if self._sender is None:
                if response is not None:
                    self.response = response
                if final:
                    self._done.set()
                return
            if self.client_gone:
                if not final:
                    return
                response = None  # nobody reads it: only end the stream
            try:
                if response is None:
                    self._sender.send(flags=FINAL)
                else:
                    self._sender.send(response, flags=FINAL if final else 0)
            except Exception:  # the client cancelled: sending raises
                self.client_gone = True

    def fail(self, message: str) -> None:
        error = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))
        self.send(error, True)

    def is_cancelled(self) -> bool:
        with self._lock:
            if self.closed or self.client_gone:
                return self.client_gone
            source = self._sender if self._sender is not None else self._request
            try:
                self.client_gone = bool(source.is_cancelled())
            except Exception:
                pass
            return self.client_gone

    def wait(self) -> Any:
        self._done.wait()
        return self.response


class _InFlight:
    """A request the engine is generating."""

    __slots__ = ("out", "generation", "request_id")

    def __init__(self, out: _Responder, generation: Generation, request_id: str) -> None:
        self.out = out
        self.generation = generation
        self.request_id = request_id


class LlmapiModel:
    """The llmapi `tensorrt_llm` model (see the package docstring and tensors.py)."""

    @classmethod
    def auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        settings = read_model_settings(pb_utils.get_model_dir())
        auto_complete_model_config.set_model_transaction_policy({"decoupled": settings.decoupled})
        auto_complete_model_config.set_max_batch_size(settings.max_batch_size)
        return auto_complete_model_config

    def initialize(self, args: dict) -> None:
        self.orphan_guard = start_orphan_guard(cpu_engine_grace_s())
        model_config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        version_dir = Path(args["model_repository"]) / str(args["model_version"])
        self.settings = read_model_settings(version_dir)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="llmapi-loop", daemon=True
        )
        self._thread.start()
        try:
            # Built on the loop's thread: the LLM API's objects belong to its loop.
            self.engine: LlmEngine = self._run(self._make_engine(version_dir))
        except BaseException:
            self._stop_loop()
            stop_orphan_guard(self.orphan_guard)
            raise
        self._in_flight: dict[int, _InFlight] = {}
        self._metrics = self._publish_metrics(args)
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="llmapi-cancel", daemon=True)
        self._watcher.start()
        pb_utils.Logger.log_info(
            f"llmapi model on {self.engine.name} (decoupled={self.decoupled}, "
            f"stream_interval={self.settings.stream_interval})"
        )

    def _publish_metrics(self, args: dict) -> MetricsPublisher | None:
        """The CPU engine's counters on Triton's metrics endpoint, as its tensorrt_llm model
        publishes them (tensorrt_llm.LLM keeps its own statistics)."""
        scheduler = getattr(self.engine, "scheduler", None)  # the CPU stand-in's
        if scheduler is None:
            return None
        labels = {"model": args["model_name"], "version": str(args["model_version"])}
        publisher = MetricsPublisher(pb_utils, scheduler, labels)
        publisher.start()
        return publisher

    async def _make_engine(self, version_dir: Path) -> LlmEngine:
        return make_engine(self.settings, version_dir)

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def execute(self, requests: list) -> list | None:
        outs = []
        for request in requests:
            out = _Responder(request, self.decoupled)
            outs.append(out)
            try:
                if is_stop_request(pb_utils, request):
                    self._stop(request, out)
                    continue
                parsed = parse_request(
                    pb_utils,
                    request,
                    decoupled=self.decoupled,
                    return_perf=self.settings.return_perf_metrics,
                )
            except RequestError as error:
                out.fail(str(error))
                continue
            except Exception as error:  # a bad request must never take the model down
                out.fail(f"the llmapi model rejected the request: {error}")
                continue
            asyncio.run_coroutine_threadsafe(self._serve(parsed, out), self.loop)
        if self.decoupled:
            return None
        return [out.wait() for out in outs]

    def _stop(self, request: Any, out: _Responder) -> None:
        request_id = request.request_id()
        if not request_id:
            raise RequestError("stop=true needs the request id of the request to cancel")
        for entry in list(self._in_flight.values()):
            if entry.request_id == request_id:
                self.loop.call_soon_threadsafe(entry.generation.abort)
        out.send(None if self.decoupled else pb_utils.InferenceResponse([]), True)

    async def _serve(self, parsed: ParsedRequest, out: _Responder) -> None:
        """Run one request on the engine, a response per step."""
        try:
            if parsed.image_urls:  # fetching and decoding stay off the loop
                parsed.request.images += await asyncio.to_thread(
                    load_image_urls, parsed.image_urls, len(parsed.request.images)
                )
            generation = self.engine.generate(parsed.request)
        except Exception as error:
            out.fail(_message(error))
            return
        key = id(out)
        self._in_flight[key] = _InFlight(out, generation, parsed.request.request_id)
        done: set[int] = set()  # sequences whose last response went out (token-id requests)
        try:
            async for step in generation:
                if parsed.token_ids:
                    self._send_tokens(parsed, step, out, done)
                elif parsed.request.streaming or step.finished:
                    response, tensors = text_response(pb_utils, step, parsed)
                    out.send(response, step.finished, tensors)
                if step.finished:
                    break
            out.send(None, True)  # no-op when the last step's response was final
        except Exception as error:
            out.fail(_message(error))
        finally:
            del self._in_flight[key]

    @staticmethod
    def _send_tokens(parsed: ParsedRequest, step: Step, out: _Responder, done: set[int]) -> None:
        """One response per sequence that moved (or ended); FINAL rides the request's last."""
        moved = [
            sequence
            for sequence in step.sequences
            if sequence.index not in done and (sequence.token_ids or sequence.finished)
        ]
        for position, sequence in enumerate(moved):
            if sequence.finished:
                done.add(sequence.index)
            last = step.finished and position == len(moved) - 1
            response, tensors = token_response(pb_utils, sequence, parsed, step)
            out.send(response, last, tensors)

    def _watch(self) -> None:
        """Abort requests whose client went away (is_cancelled is an IPC call: polled)."""
        period = max(self.settings.cancellation_check_period_ms, 1) / 1000
        while not self._stopping.wait(period):
            for entry in list(self._in_flight.values()):
                if entry.out.is_cancelled():
                    self.loop.call_soon_threadsafe(entry.generation.abort)

    def finalize(self) -> None:
        self._stopping.set()
        if self._metrics is not None:
            self._metrics.stop()
        for entry in list(self._in_flight.values()):
            self.loop.call_soon_threadsafe(entry.generation.abort)
        try:
            self._run(_call(self.engine.shutdown))
        finally:
            self._stop_loop()
            stop_orphan_guard(self.orphan_guard)

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


async def _call(function: Any) -> Any:
    return function()


def _message(error: Exception) -> str:
    if isinstance(error, RequestError):
        return str(error)
    return f"error generating the request: {type(error).__name__}: {error}"
