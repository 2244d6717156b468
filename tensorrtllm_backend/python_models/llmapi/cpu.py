"""The CPU stand-in behind the llmapi model: the LLM API's contract on the CPU engine.

`model` in model.yaml names either a Hugging Face checkpoint (run by the hf backend with
transformers) or a CPU engine dir (config.json with a `cpu_engine` section: the synthetic
backend, for load tests). Requests run on the CPU engine's in-flight batching scheduler, one
GenRequest per sequence (`n`: sequence i samples with seed + i), and come back as the LLM API's
do: steps holding each sequence's new token ids, its text so far (when detokenized), log probs
with top-k alternatives, finish and stop reasons.

As the LLM API: sampling is greedy unless temperature, top_k or top_p ask otherwise (an unset
top_p then means 1, an unset top_k all tokens); `max_tokens` defaults to 32; the end token is the
tokenizer's; `stream_interval` (model.yaml) hands tokens over N at a time after the first; guides
need `guided_decoding_backend: xgrammar`. Differences, each stated where it applies: stop strings
are matched on the decoded text (the LLM API matches their token ids), the KV-cache perf metrics
are 0 (there is no paged cache), and `best_of` > n and LoRA adapters are refused (they need
tensorrt_llm).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ...common.cpu_engine_config import load_engine_config
from ...common.guides import GuideError
from ...common.media import MediaError, decode_image
from ...common.tokenization import IncrementalDetokenizer, StopStringMatcher, load_tokenizer
from ..cpu_engine.loading import EngineGuides, PrefixCache, make_backend, prefix_cache
from ..cpu_engine.request import Chunk, FinishReason, GenRequest, SamplingParams, TopLogprobs
from ..cpu_engine.scheduler import Scheduler
from ..cpu_engine.triton_io import MAX_CONTEXT_LOGITS, split_sequences
from ..prompt_scores import PromptScores, reduce_logits
from ..request_error import RequestError
from ..stub_settings import media_limits
from .engine import EngineRequest, PerfMetrics, Sampling, SequenceStep, Step
from .settings import ModelSettings, checkpoint_dir

DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block's default
_REASONS = {
    FinishReason.END_ID: "stop",
    FinishReason.STOP_WORDS: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "cancelled",
}


class CpuEngine:
    """LlmEngine over the CPU engine's scheduler."""

    def __init__(self, settings: ModelSettings, version_dir: Path) -> None:
        model_dir = checkpoint_dir(str(settings.llm_args["model"]), version_dir)
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        tokenizer_arg = settings.llm_args.get("tokenizer")
        tokenizer_dir = (
            checkpoint_dir(str(tokenizer_arg), version_dir) if tokenizer_arg else model_dir
        )
        self.tokenizer = load_tokenizer(tokenizer_dir)
        args = settings.llm_args
        guides_refused = None
        self.prefix_cache = _prefix_cache(args.get("kv_cache_config"))
        reuse = self.prefix_cache.table if self.prefix_cache is not None else None
        if "cpu_engine" in config:  # a CPU engine dir: its own limits and backend
            engine = load_engine_config(model_dir)
            build = engine.build_config
            backend = make_backend(engine, reuse)
            self.max_seq_len, self.max_input_len = build.max_seq_len, build.max_input_len
            max_batch_size = build.max_batch_size
            vocab_size = engine.pretrained_config.vocab_size
            self.name = f"the CPU stand-in ({engine.cpu_engine.mode}) from {model_dir}"
            if engine.cpu_engine.mode == "synthetic":
                guides_refused = (
                    "guided decoding needs a model with logits; the synthetic CPU engine has none"
                )
        else:  # a Hugging Face checkpoint, run with transformers
            from ..cpu_engine.hf import HFBackend

            backend = HFBackend(model_dir, reuse=reuse)
            vocab_size = backend.vocab_size
            text = config.get("text_config") or config  # a vision-language model's LM
            self.max_seq_len = int(
                args.get("max_seq_len") or text.get("max_position_embeddings") or 2048
            )
            self.max_input_len = int(args.get("max_input_len") or self.max_seq_len - 1)
            max_batch_size = int(args.get("max_batch_size") or DEFAULT_MAX_BATCH_SIZE)
            self.name = f"the CPU stand-in (transformers) from {model_dir}"
        self.vocab_size = vocab_size
        self.takes_images = backend.takes_images
        self._tokenizer_dir = tokenizer_dir
        self._processor: Any = None  # a VLM's, for text prompts with images (made when needed)
        self.guides: EngineGuides | None = None
        if guides_refused is None and settings.guided_decoding_backend is None:
            guides_refused = (
                "guided decoding is off for this model: model.yaml sets no "
                "guided_decoding_backend (pack it with guided_decoding_backend: xgrammar)"
            )
        elif guides_refused is None and settings.guided_decoding_backend != "xgrammar":
            guides_refused = (
                f"guided_decoding_backend {settings.guided_decoding_backend!r} is not supported "
                "by the CPU stand-in (xgrammar)"
            )
        elif guides_refused is None:
            self.guides = EngineGuides(tokenizer_dir, vocab_size)
        self.guides_refused = guides_refused
        self.scheduler = Scheduler(
            backend,
            max_batch_size,
            cancel_poll_interval_s=1.0,  # abort() flags requests; the sinks are never polled
            stream_interval=settings.stream_interval,
            name="llmapi-cpu-scheduler",
        )
        self.scheduler.start()

    def generate(self, request: EngineRequest) -> CpuGeneration:
        sampling = request.sampling
        if request.lora is not None:
            raise RequestError(
                "LoRA adapters need tensorrt_llm: the CPU stand-in does not apply them"
            )
        if sampling.best_of is not None and sampling.best_of != sampling.n:
            raise RequestError("sampling_param_best_of > n needs tensorrt_llm")
        if sampling.guide is not None and self.guides_refused is not None:
            raise RequestError(self.guides_refused)
        if request.images and not self.takes_images:
            raise RequestError("this model takes no images: send the prompt alone")
        if request.images:  # each placeholder once, as the LLM API takes it: expanded here
            if isinstance(request.prompt, str):
                prompt = self._expand(request.prompt, request.images, True)
            else:
                text = self.tokenizer.decode(request.prompt, skip_special_tokens=False)
                prompt = self._expand(text, request.images, False)
        elif isinstance(request.prompt, str):
            prompt = list(self.tokenizer.encode(request.prompt))
        else:
            prompt = list(request.prompt)
        if not prompt:
            raise RequestError("the prompt encodes to no tokens")
        if len(prompt) > self.max_input_len:
            raise RequestError(
                f"the prompt is {len(prompt)} tokens; max_input_len is {self.max_input_len}"
            )
        if len(prompt) + sampling.max_tokens > self.max_seq_len:
            raise RequestError(
                f"sampling_param_max_tokens {sampling.max_tokens} with a {len(prompt)}-token "
                f"prompt: ask for 1 to {self.max_seq_len - len(prompt)} "
                f"(max_seq_len {self.max_seq_len})"
            )
        if (
            sampling.prompt_logprobs is not None
            and len(prompt) * self.vocab_size > MAX_CONTEXT_LOGITS
        ):
            raise RequestError(
                f"scoring a {len(prompt)}-token prompt needs {len(prompt)} x {self.vocab_size} "
                f"logits, more than the CPU stand-in's {MAX_CONTEXT_LOGITS}: send a shorter prompt"
            )
        bad_ids = [t for t in sampling.bad_token_ids if not 0 <= t < self.vocab_size]
        if bad_ids:
            raise RequestError(f"sampling_param_bad_token_ids {bad_ids} outside the vocabulary")
        return CpuGeneration(self, request, prompt)

    def _expand(self, prompt: str, images: list[bytes], special: bool) -> list[int]:
        """A prompt's token ids with each image placeholder expanded by the model's processor,
        as the LLM API's input processors do (token ids are decoded to text first, and then get
        no special tokens: `special` False)."""
        from ...common.processors import load_processor

        if self._processor is None:
            self._processor = load_processor(self._tokenizer_dir)
        try:
            decoded = [decode_image(data, media_limits()) for data in images]
        except MediaError as error:
            raise RequestError(str(error)) from None
        try:
            encoded = self._processor(text=[prompt], images=decoded, add_special_tokens=special)
        except ValueError as error:  # e.g. placeholders and images do not match
            raise RequestError(f"the prompt and its images do not fit: {error}") from None
        return [int(token) for token in encoded["input_ids"][0]]

    def shutdown(self) -> None:
        self.scheduler.stop()
        if self.prefix_cache is not None:
            self.prefix_cache.close()


def _prefix_cache(kv_cache_config: Any) -> PrefixCache | None:
    """The LLM API's KV-cache block reuse as the stand-in's prefix cache: on unless
    `enable_block_reuse` is false (its default), `tokens_per_block` tokens per block (32),
    `max_tokens` of them at most."""
    config = kv_cache_config if isinstance(kv_cache_config, dict) else {}
    if config.get("enable_block_reuse") is False:
        return None
    size = int(config.get("tokens_per_block") or DEFAULT_TOKENS_PER_BLOCK)
    return prefix_cache(size, int(config.get("max_tokens") or 0) or None)


def _cpu_sampling(sampling: Sampling, seed_offset: int = 0) -> SamplingParams:
    """The LLM API's sampling as the CPU engine's: greedy unless asked to sample."""
    temperature, top_k, top_p = sampling.temperature, sampling.top_k, sampling.top_p
    greedy = (
        (temperature is None and top_k is None and top_p is None)
        or top_k == 1
        or top_p == 0.0
        or temperature == 0.0
    )
    return SamplingParams(
        temperature=0.0 if greedy else (1.0 if temperature is None else temperature),
        top_k=top_k or 0,
        top_p=1.0 if top_p is None else top_p,
        repetition_penalty=sampling.repetition_penalty or 1.0,
        presence_penalty=sampling.presence_penalty or 0.0,
        frequency_penalty=sampling.frequency_penalty or 0.0,
        seed=(sampling.seed or 0) + seed_offset,
    )


class _Sequence:
    """One sequence's state on the model's loop: its request, text and how it ended."""

    def __init__(self, index: int, tokenizer: Any, sampling: Sampling) -> None:
        self.index = index
        self.req: GenRequest | None = None
        self.text = ""
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        needs_text = sampling.detokenize or bool(sampling.stop)
        self.detokenizer = IncrementalDetokenizer(tokenizer) if needs_text else None
        self.stops = StopStringMatcher(sampling.stop)


# What the scheduler handed over for one sequence at once (its thread -> the model's loop):
# (sequence index, tokens, log probs, alternatives, finish reason or None).
_Arrival = tuple[int, list[int], list[float], list[TopLogprobs], FinishReason | None]


class CpuGeneration:
    """One request on the CPU engine: the scheduler's sinks feed it, the model iterates it."""

    def __init__(self, engine: CpuEngine, request: EngineRequest, prompt: list[int]) -> None:
        self._engine = engine
        self._request = request
        self._prompt = prompt
        sampling = request.sampling
        self._sequences = [_Sequence(i, engine.tokenizer, sampling) for i in range(sampling.n)]
        self._lock = threading.Lock()
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._arrivals: deque[_Arrival] = deque()
        self._error: str | None = None
        self._aborted = False
        self._scores: PromptScores | None = None

    # -- scheduler side (its thread) ---------------------------------------------------------
    def _arrive(self, arrival: _Arrival | None, error: str | None = None) -> None:
        with self._lock:
            if arrival is not None:
                self._arrivals.append(arrival)
            if error is not None:
                self._error = error
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._loop.call_soon_threadsafe(_resolve, waiter)

    def _sink(self, sequence: _Sequence) -> _SequenceSink:
        return _SequenceSink(self, sequence.index)

    # -- model side (the loop) ---------------------------------------------------------------
    def abort(self) -> None:
        self._aborted = True
        for sequence in self._sequences:
            if sequence.req is not None:
                sequence.req.cancel()

    def __aiter__(self) -> AsyncIterator[Step]:
        return self._steps()

    async def _steps(self) -> AsyncIterator[Step]:
        """One step per hand-over of the scheduler (a token, or the stream interval's tokens),
        as the LLM API yields once per response of its executor."""
        await self._submit()
        streaming = self._request.streaming
        gathered: list[SequenceStep] | None = None  # not streaming: one step at the end
        while True:
            arrival = await self._next()
            step = self._step(arrival)
            if not streaming:
                gathered = _merge(gathered, step.sequences)
                step = Step(gathered, step.finished)
            if step.finished or streaming:
                yield step
            if step.finished:
                return

    async def _submit(self) -> None:
        request, sampling = self._request, self._request.sampling
        grammar = None
        if sampling.guide is not None:
            guides = self._engine.guides
            assert guides is not None  # generate() refused guides otherwise
            try:
                grammar = await asyncio.to_thread(
                    guides.compile, sampling.guide.type, sampling.guide.guide
                )
            except GuideError as error:
                raise RequestError(str(error)) from None
        tokenizer = self._engine.tokenizer
        bad_words = [list(tokenizer.encode(w, add_special_tokens=False)) for w in sampling.bad]
        bad_words = [w for w in bad_words if w] + [[t] for t in sampling.bad_token_ids]
        end_id = None if sampling.ignore_eos else sampling.end_id
        if end_id is None and not sampling.ignore_eos:
            end_id = tokenizer.eos_token_id
        row = {
            "prompt": self._prompt,
            "max_new_tokens": sampling.max_tokens,
            "request_id": request.request_id,
            "sequence_index": 0,
            "end_id": end_id,
            "pad_id": sampling.pad_id,
            "stop_token_ids": frozenset(sampling.stop_token_ids),
            "bad_words": bad_words,
            "min_tokens": sampling.min_tokens or 0,
            # Stop strings end a sequence as soon as its text holds one, so their sequences
            # stream inside even when the request does not.
            "streaming": request.streaming or bool(sampling.stop),
            "exclude_input_in_output": True,
            "return_log_probs": True,  # cheap here, and cumulative_logprob needs them
            "top_logprobs": sampling.logprobs or 0,
            "context_logits": sampling.prompt_logprobs is not None,
            "sampling": _cpu_sampling(sampling),
            "guided": None
            if sampling.guide is None
            else (sampling.guide.type, sampling.guide.guide),
            "grammar": grammar,
            "images": request.images,
        }
        for position, (sequence, arguments) in enumerate(
            zip(self._sequences, split_sequences(row, sampling.n), strict=True)
        ):
            if position:  # the prompt's logits once, from the first sequence
                arguments = {**arguments, "context_logits": False}
            sequence.req = GenRequest(sink=self._sink(sequence), **arguments)
        if self._aborted:
            return self._finish_unsubmitted()
        for sequence in self._sequences:
            assert sequence.req is not None
            self._engine.scheduler.submit(sequence.req)

    def _finish_unsubmitted(self) -> None:
        for sequence in self._sequences:
            self._arrivals.append((sequence.index, [], [], [], FinishReason.CANCELLED))

    async def _next(self) -> _Arrival:
        """The next hand-over (waiting for it); a failure of the request raises."""
        while True:
            with self._lock:
                error = self._error
                if error is None and self._arrivals:
                    return self._arrivals.popleft()
                if error is None:
                    waiter = self._waiter = self._loop.create_future()
            if error is not None:
                self.abort()
                raise RequestError(error)
            await waiter

    def _step(self, arrival: _Arrival) -> Step:
        """The LLM API's next yield: the sequence that moved, every other one as it stands."""
        index, tokens, logprobs, top, reason = arrival
        steps = [
            self._sequence_step(sequence, tokens, logprobs, top, reason)
            if sequence.index == index
            else self._sequence_step(sequence, [], [], [], None)
            for sequence in self._sequences
        ]
        first = self._sequences[0].req
        return Step(
            steps,
            all(step.finished for step in steps),
            cached_tokens=first.cached_tokens if first is not None else 0,
            prompt_scores=self._prompt_scores(),
        )

    def _prompt_scores(self) -> PromptScores | None:
        """The prompt's scores, reduced from the logits of its forward (first sequence's)."""
        k = self._request.sampling.prompt_logprobs
        req = self._sequences[0].req
        if k is not None and self._scores is None and req is not None:
            logits, req.prompt_logits = req.prompt_logits, None
            if logits is not None:
                self._scores = reduce_logits(logits, self._prompt, k)
        return self._scores

    def _sequence_step(
        self,
        sequence: _Sequence,
        tokens: list[int],
        logprobs: list[float],
        top: list[TopLogprobs],
        reason: FinishReason | None,
    ) -> SequenceStep:
        sampling = self._request.sampling
        req = sequence.req
        if sequence.finish_reason is None:
            if sequence.detokenizer is not None:
                self._add_text(sequence, sequence.detokenizer.feed(tokens))
            if reason is not None and sequence.finish_reason is None:
                self._end(sequence, reason)
        wants = sampling.logprobs is not None
        return SequenceStep(
            index=sequence.index,
            token_ids=tokens,
            text=sequence.text,
            logprobs=logprobs if wants else None,
            top=top if wants and sampling.logprobs else None,
            finish_reason=sequence.finish_reason,
            stop_reason=sequence.stop_reason,
            cumulative_logprob=None if req is None else req.cum_logprob,
            perf=_perf(req) if sequence.finish_reason is not None and req is not None else None,
        )

    def _add_text(self, sequence: _Sequence, text: str) -> None:
        emit, stopped = sequence.stops.feed(text) if sequence.stops.active else (text, False)
        sequence.text += emit
        if stopped:
            sequence.finish_reason = "stop"
            sequence.stop_reason = sequence.stops.matched
            if sequence.req is not None:
                sequence.req.cancel()  # the scheduler drops it before its next step

    def _end(self, sequence: _Sequence, reason: FinishReason) -> None:
        if sequence.detokenizer is not None:
            self._add_text(sequence, sequence.detokenizer.flush())
            if sequence.finish_reason is not None:
                return
            sequence.text += sequence.stops.flush()
        sequence.finish_reason = _REASONS.get(reason, "stop")
        req = sequence.req
        if reason is FinishReason.END_ID and req is not None and req.ended_on != req.end_id:
            sequence.stop_reason = req.ended_on  # a stop token id (None: the grammar ended)


def _merge(before: list[SequenceStep] | None, after: list[SequenceStep]) -> list[SequenceStep]:
    """Two steps as one: the tokens (log probs, alternatives) of both, the rest as of the later."""
    if before is None:
        return after
    for earlier, later in zip(before, after, strict=True):
        later.token_ids = earlier.token_ids + later.token_ids
        if later.logprobs is not None:
            later.logprobs = (earlier.logprobs or []) + later.logprobs
        if later.top is not None:
            later.top = (earlier.top or []) + later.top
    return after


def _perf(req: GenRequest) -> PerfMetrics:
    """The request's timings; no paged KV cache here, so its block counts stay 0."""
    return PerfMetrics(
        arrival_time_ns=req.arrival_ns,
        first_scheduled_time_ns=req.first_scheduled_ns,
        first_token_time_ns=req.first_token_ns,
        last_token_time_ns=req.last_token_ns,
    )


class _SequenceSink:
    """The scheduler's Sink for one sequence of a CpuGeneration (called on its thread)."""

    __slots__ = ("_generation", "_index", "_last")

    def __init__(self, generation: CpuGeneration, index: int) -> None:
        self._generation = generation
        self._index = index
        self._last: _Arrival | None = None  # the final tokens, sent with the finish reason

    def send_tokens(self, req: GenRequest, chunk: Chunk, final: bool) -> None:
        arrival = (self._index, chunk.tokens, chunk.logprobs or [], chunk.top or [], None)
        if final:  # finish() follows at once: one hand-over, as the LLM API's last response
            self._last = arrival
        else:
            self._generation._arrive(arrival)

    def finish(self, req: GenRequest, reason: FinishReason) -> None:
        if self._last is not None:
            index, tokens, logprobs, top, _ = self._last
            arrival = (index, tokens, logprobs, top, reason)
        elif req.streaming:  # its tokens went out with send_tokens
            arrival = (self._index, [], [], [], reason)
        else:  # the whole output arrives now
            arrival = (self._index, list(req.generated), req.logprobs, req.top, reason)
        self._generation._arrive(arrival)

    def fail(self, req: GenRequest, message: str) -> None:
        self._generation._arrive(None, message)

    def is_cancelled(self) -> bool:
        return False


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
