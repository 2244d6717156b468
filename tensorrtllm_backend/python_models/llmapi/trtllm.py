"""The adapter: every call this project makes into `tensorrt_llm` is in this module.

It builds one `tensorrt_llm.LLM` from model.yaml's LLM arguments, turns each EngineRequest into
a `SamplingParams` (with `GuidedDecodingParams`, and a `LoRARequest` when the request names an
adapter), calls `generate_async` with keywords only, and reads the `RequestOutput` it yields back
into steps; a request's images go as PIL images in the prompt dict's `multi_modal_data`.
Written against TensorRT-LLM 1.2 (the facts in the project's TRTLLM_LLMAPI.md); where that
source was uncertain the code reads defensively and says so. tests/unit/python_models/
test_llmapi_trtllm.py runs it against a fake `tensorrt_llm` built from the documented API, whose
constructors accept exactly the documented keywords.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import tensorrt_llm
from tensorrt_llm.executor.request import LoRARequest
from tensorrt_llm.inputs.registry import DefaultInputProcessor
from tensorrt_llm.sampling_params import GuidedDecodingParams, SamplingParams

from ...common.media import MediaError, decode_image
from ..kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvEventPublisher,
    publisher_from_settings,
)
from ..prompt_scores import PromptScores, reduce_logits
from ..request_error import RequestError
from ..stub_settings import media_limits
from . import engine
from .settings import ModelSettings

log = logging.getLogger(__name__)

# What SamplingParams takes as it is (engine.Sampling's fields carry its names).
_PLAIN_FIELDS = (
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "length_penalty",
    "seed",
    "min_tokens",
    "n",
    "best_of",
    "pad_id",
    "ignore_eos",
    "logprobs",
    "return_perf_metrics",
    "detokenize",
)
# A token the runtime left out of its alternatives (releases up to 1.2 do not add the sampled
# token when it falls outside the top k): OpenAI's floor for a log prob, as trtllm-serve uses.
MISSING_LOGPROB = -9999.0


def llm_arguments(settings: ModelSettings) -> dict[str, Any]:
    """model.yaml's LLM arguments as NVIDIA's model passes them: through
    `update_llm_args_with_extra_dict`, which makes the nested sections (kv_cache_config, ...)
    config objects. Where a release lacks that helper the dict goes as it is (the LLM
    arguments are pydantic models that accept nested dicts)."""
    args = dict(settings.llm_args)
    try:
        from tensorrt_llm.llmapi.llm_args import update_llm_args_with_extra_dict
    except ImportError:
        return args
    return dict(update_llm_args_with_extra_dict({}, args))


def guided_decoding(guide: engine.Guide) -> Any:
    """The C++ backend's guide types as GuidedDecodingParams: `json` without a guide is any JSON
    object (json_object), a schema goes in `json`, EBNF in `grammar`."""
    if guide.type == "json" and not guide.guide:
        return GuidedDecodingParams(json_object=True)
    if guide.type in ("json", "json_schema"):
        return GuidedDecodingParams(json=guide.guide)
    if guide.type == "regex":
        return GuidedDecodingParams(regex=guide.guide)
    if guide.type == "ebnf_grammar":
        return GuidedDecodingParams(grammar=guide.guide)
    return GuidedDecodingParams(structural_tag=guide.guide)


def sampling_params(sampling: engine.Sampling) -> Any:
    """A SamplingParams with only the fields the request set, by keyword."""
    fields: dict[str, Any] = {
        name: value for name in _PLAIN_FIELDS if (value := getattr(sampling, name)) is not None
    }
    if not fields.get("ignore_eos"):
        fields.pop("ignore_eos", None)
    if fields.get("logprobs") == 0:
        fields["logprobs"] = 1  # the chosen token's log prob: the top 1 (see _logprobs)
    stop_ids = list(sampling.stop_token_ids)
    if sampling.end_id is not None:
        if sampling.stop or sampling.bad:
            # The LLM API tokenizes stop and bad strings only while end_id is unset (its
            # _setup runs then, and fills end_id from the tokenizer); with both, the request
            # would fail. The custom end token becomes a stop token instead: it ends the
            # sequence and is cut from it all the same.
            stop_ids.append(sampling.end_id)
        else:
            fields["end_id"] = sampling.end_id
    if sampling.stop:
        fields["stop"] = list(sampling.stop)
    if stop_ids:
        fields["stop_token_ids"] = stop_ids
    if sampling.bad:
        fields["bad"] = list(sampling.bad)
    if sampling.bad_token_ids:
        fields["bad_token_ids"] = list(sampling.bad_token_ids)
    if sampling.guide is not None:
        fields["guided_decoding"] = guided_decoding(sampling.guide)
    if sampling.prompt_logprobs is not None:
        # Scored from the context logits beside the engine: SamplingParams.prompt_logprobs
        # (1.2) lists the top k only, without the prompt's own token when it is not among them.
        fields["return_context_logits"] = True
    # The prompt is never echoed by the engine: the model prepends it itself when asked.
    fields["exclude_input_from_output"] = True
    return SamplingParams(**fields)


def lora_request(lora: engine.LoraSpec) -> Any:
    """LoRARequest checks that the adapter's path exists (a ValueError: the request's error)."""
    return LoRARequest(
        lora_name=lora.name,
        lora_int_id=lora.int_id,
        lora_path=lora.path,
        lora_ckpt_source=lora.ckpt_source,
    )


def pil_image(data: bytes) -> Any:
    """An encoded image (checked by the service) as the RGB PIL image every multimodal input
    processor takes, decoded within the service's image bounds."""
    try:
        return decode_image(data, media_limits())
    except MediaError as error:
        raise RequestError(str(error)) from None


def prompt_inputs(request: engine.EngineRequest) -> str | dict[str, Any]:
    """generate_async's `inputs`: the text, or {"prompt_token_ids": ids}; with images, that
    TextPrompt / TokensPrompt plus multi_modal_data {"image": [PIL images]}.

    The prompt must already hold the model's image placeholder once per image, unexpanded
    (`<|vision_start|><|image_pad|><|vision_end|>` for Qwen2-VL, `<image>` for LLaVA-NeXT, as
    the chat template renders it): the model's input processor expands each into the image's
    feature tokens. Token ids go through it too (decoded back to text first, on most models)."""
    prompt = request.prompt
    images = getattr(request, "images", None) or []  # EngineRequest.images: encoded bytes
    if not images:
        return prompt if isinstance(prompt, str) else {"prompt_token_ids": list(prompt)}
    key = "prompt" if isinstance(prompt, str) else "prompt_token_ids"
    value = prompt if isinstance(prompt, str) else list(prompt)
    return {key: value, "multi_modal_data": {"image": [pil_image(data) for data in images]}}


def takes_images(llm: Any) -> bool:
    """Whether the LLM has a multimodal input processor. The LLM API tells the two apart the
    same way (DefaultInputProcessor only tokenizes), and with the default one it drops images:
    ignored beside token ids, a logged warning beside text."""
    processor = getattr(llm, "input_processor", None)
    return processor is not None and not isinstance(processor, DefaultInputProcessor)


class TrtllmEngine:
    """LlmEngine over one `tensorrt_llm.LLM` (PyTorch backend)."""

    def __init__(self, settings: ModelSettings) -> None:
        self._settings = settings
        arguments = llm_arguments(settings)
        self._events = publisher_from_settings()
        if self._events is not None:
            arguments = with_kv_events(arguments)
        self._block_size = tokens_per_block(arguments.get("kv_cache_config"))
        self._event_buffer = event_buffer_size(arguments.get("kv_cache_config"))
        self._llm = tensorrt_llm.LLM(**arguments)
        self._takes_images = takes_images(self._llm)
        self._bridge: KvEventBridge | None = None
        self._event_task: asyncio.Task[None] | None = None
        self.name = f"tensorrt_llm {getattr(tensorrt_llm, '__version__', '')} ({settings.path})"

    def generate(self, request: engine.EngineRequest) -> TrtllmGeneration:
        if request.sampling.guide is not None and self._settings.guided_decoding_backend is None:
            # The LLM API would drop the guide without a word.
            raise RequestError(
                "guided decoding is off for this model: model.yaml sets no "
                "guided_decoding_backend (pack it with guided_decoding_backend: xgrammar)"
            )
        if getattr(request, "images", None):
            self._check_images(request)
        try:
            params = sampling_params(request.sampling)
            lora = lora_request(request.lora) if request.lora is not None else None
        except (ValueError, TypeError) as error:  # SamplingParams / LoRARequest validation
            raise RequestError(str(error)) from None
        inputs = prompt_inputs(request)
        output = self._llm.generate_async(
            inputs=inputs,
            sampling_params=params,
            lora_request=lora,
            streaming=request.streaming,
        )
        if self._events is not None:
            if self._bridge is None:
                # The LLM API's event queue exists once a request went in.
                self._bridge = KvEventBridge(
                    self._llm, self._events, self._block_size, self._event_buffer
                )
                self._event_task = asyncio.get_running_loop().create_task(self._bridge.run())
            self._bridge.submitted()
        return TrtllmGeneration(output, request)

    def _check_images(self, request: engine.EngineRequest) -> None:
        if not self._takes_images:
            raise RequestError(
                "this model takes no images: TensorRT-LLM has no multimodal input processor "
                "for its checkpoint (images need a vision-language model)"
            )
        if request.sampling.prompt_logprobs is not None:
            # The engine's prompt holds each image's feature tokens (ids outside the
            # vocabulary), not the ids that were sent.
            raise RequestError("prompt log probs are not available for prompts with images")

    def shutdown(self) -> None:
        if self._event_task is not None:
            self._event_task.cancel()
        self._llm.shutdown()
        if self._events is not None:
            self._events.close()


class TrtllmGeneration:
    """A RequestOutput read as steps. The LLM API updates one RequestOutput in place at each
    yield; its `*_diff` properties hold what arrived since the previous one."""

    def __init__(self, output: Any, request: engine.EngineRequest) -> None:
        self._output = output
        self._request = request
        self._scores: PromptScores | None = None

    def abort(self) -> None:
        self._output.abort()

    def __aiter__(self) -> AsyncIterator[engine.Step]:
        return self._steps()

    async def _steps(self) -> AsyncIterator[engine.Step]:
        if not self._request.streaming:
            await self._output.aresult()
            yield self._step(whole=True)
            return
        async for _ in self._output:
            step = self._step(whole=False)
            yield step
            if step.finished:
                return

    def _step(self, *, whole: bool) -> engine.Step:
        output = self._output
        k = self._request.sampling.logprobs
        sequences = []
        for completion in output.outputs:
            tokens = list(completion.token_ids if whole else completion.token_ids_diff)
            chosen, top = (None, None)
            if k is not None:
                raw = completion.logprobs if whole else completion.logprobs_diff
                chosen, top = _logprobs(tokens, list(raw or []), k)
            sequences.append(
                engine.SequenceStep(
                    index=int(completion.index),
                    token_ids=tokens,
                    text=completion.text or "",
                    logprobs=chosen,
                    top=top,
                    finish_reason=completion.finish_reason,
                    stop_reason=completion.stop_reason,
                    cumulative_logprob=completion.cumulative_logprob,
                    perf=_perf(completion.request_perf_metrics)
                    if completion.finish_reason is not None
                    else None,
                )
            )
        sequences.sort(key=lambda sequence: sequence.index)
        return engine.Step(
            sequences,
            bool(output.finished),
            cached_tokens=int(getattr(output, "cached_tokens", 0) or 0),
            prompt_scores=self._prompt_scores(),
        )

    def _prompt_scores(self) -> PromptScores | None:
        """The prompt's scores once its context logits arrived (reduced on their device)."""
        k = self._request.sampling.prompt_logprobs
        logits = getattr(self._output, "context_logits", None)
        if k is None or self._scores is not None or logits is None:
            return self._scores
        prompt = list(self._output.prompt_token_ids)
        if logits.shape[0] < len(prompt):
            # The PyTorch backend computes logits only for the prompt tokens not found in its
            # KV cache (block reuse).
            raise RequestError(
                f"the engine returned logits for {logits.shape[0]} of the prompt's "
                f"{len(prompt)} tokens: the rest came from its KV cache. Scoring prompts needs "
                "kv_cache_config.enable_block_reuse: false in model.yaml"
            )
        self._scores = reduce_logits(logits, prompt, k)
        return self._scores


def _logprobs(
    tokens: list[int], raw: list[Any], k: int
) -> tuple[list[float], list[engine.TopLogprobs] | None]:
    """The chosen tokens' log probs and their top-k alternatives, from the LLM API's per-token
    entries: a dict token id -> Logprob(logprob, rank) (PyTorch backend), or a float (the
    chosen token's only, the legacy TensorRT path)."""
    chosen: list[float] = []
    top: list[engine.TopLogprobs] = []
    for token, entry in zip(tokens, raw, strict=False):
        if isinstance(entry, dict):
            value = entry.get(token)
            chosen.append(_value(value) if value is not None else MISSING_LOGPROB)
            ranked = sorted(entry.items(), key=lambda item: _rank(item[1]))[:k]
            top.append(([int(t) for t, _ in ranked], [_value(v) for _, v in ranked]))
        else:
            chosen.append(float(entry))
            top.append(([], []))
    if len(chosen) < len(tokens):
        raise RequestError(
            f"the engine returned log probs for {len(chosen)} of {len(tokens)} tokens"
        )
    if k == 0:
        return chosen, None
    if any(len(ids) < k for ids, _ in top):
        raise RequestError(
            f"the engine returned fewer than the {k} alternatives asked for per token "
            "(this TensorRT-LLM path returns the chosen token's log prob only)"
        )
    return chosen, top


def _value(entry: Any) -> float:
    value = float(getattr(entry, "logprob", entry))
    return value if not math.isnan(value) else MISSING_LOGPROB


def _rank(entry: Any) -> tuple[int, float]:
    """Rank 1 first; entries without a rank by their log prob."""
    rank = getattr(entry, "rank", None)
    return (rank if rank is not None else 1 << 30, -_value(entry))


# Events the LLM API buffers between two reads (KvCacheConfig.event_buffer_max_size; 0: off).
KV_EVENT_BUFFER = 4096
# How long one read of the LLM API's events waits for the next. Its iterator ends after that long
# without an event and stays ended until the next generate_async: an event that comes later (a
# long request's blocks stored or evicted as it finishes, with no request after it) would wait
# for the next request. So the read outlasts any quiet stretch of a running engine; only an
# engine idle for that long ends it, and the bridge reads again when the next request goes in.
KV_EVENT_WAIT_S = 3600.0
DEFAULT_TOKENS_PER_BLOCK = 32  # KvCacheConfig's


def with_kv_events(arguments: dict[str, Any]) -> dict[str, Any]:
    """The LLM arguments with the engine's KV-cache events on (block reuse and an event
    buffer), as a publisher of them needs; what model.yaml set is kept."""
    config = arguments.get("kv_cache_config") or {}
    if isinstance(config, dict):
        config = {"enable_block_reuse": True, **config}
        config["event_buffer_max_size"] = config.get("event_buffer_max_size") or KV_EVENT_BUFFER
    else:
        if not getattr(config, "event_buffer_max_size", 0):
            config.event_buffer_max_size = KV_EVENT_BUFFER
    return {**arguments, "kv_cache_config": config}


def tokens_per_block(kv_cache_config: Any) -> int:
    """KvCacheConfig.tokens_per_block, as a dict or the config object holds it (32 unset)."""
    if isinstance(kv_cache_config, dict):
        value = kv_cache_config.get("tokens_per_block")
    else:
        value = getattr(kv_cache_config, "tokens_per_block", None)
    return int(value or DEFAULT_TOKENS_PER_BLOCK)


def event_buffer_size(kv_cache_config: Any) -> int:
    """KvCacheConfig.event_buffer_max_size as with_kv_events left it (0: no events)."""
    if isinstance(kv_cache_config, dict):
        value = kv_cache_config.get("event_buffer_max_size")
    else:
        value = getattr(kv_cache_config, "event_buffer_max_size", None)
    return int(value or 0)


class KvEventBridge:
    """The LLM API's KV-cache events as vLLM's, published (python_models/kv_events.py).

    The LLM API gives dicts (TensorRT-LLM's KVCacheEventSerializer): "created" (the cache is new:
    AllBlocksCleared), "stored" (blocks with their token ids, after `parent_hash`), "removed",
    "updated" (priority or cache level: dropped, since a block moved to host memory stays
    reusable, and "removed" follows when it leaves). Blocks not full (fewer tokens than the
    engine's block size) are left out, as Dynamo's publisher does, and so is their later
    removal; with sliding-window layers only the largest window's events count. With attention
    data parallelism every rank's events (`attention_dp_rank`) go to this one stream.

    Events lost before they were read (a gap in `event_id`) make it publish AllBlocksCleared
    first: see :meth:`_resync`."""

    def __init__(
        self,
        llm: Any,
        publisher: KvEventPublisher,
        block_size: int,
        buffer_size: int = KV_EVENT_BUFFER,
    ) -> None:
        self._llm = llm
        self._publisher = publisher
        self._block_size = block_size
        self._buffer_size = buffer_size
        self._partial: set[int] = set()
        self._window = 0
        self._next_ids: dict[int | None, int] = {}  # attention DP rank -> the event_id due next
        self._submitted = asyncio.Event()

    def submitted(self) -> None:
        """A request went in (generate_async): an iterator that ended yields again."""
        self._submitted.set()

    async def run(self) -> None:
        while True:
            self._submitted.clear()
            async for event in self._llm.get_kv_cache_events_async(timeout=KV_EVENT_WAIT_S):
                try:
                    translated = self.translate(event)
                    if translated:
                        self._publisher.publish(translated)
                except Exception:  # one event this bridge cannot read must not end the stream
                    log.exception("KV-cache event not published: %r", event)
            # KV_EVENT_WAIT_S without an event: the iterator stays ended until a request goes in.
            await self._submitted.wait()

    def translate(self, event: Any) -> list[KvEvent]:
        if isinstance(event, str):
            event = json.loads(event)
        return self._resync(event) + self._translate(event)

    def _resync(self, event: dict[str, Any]) -> list[KvEvent]:
        """[AllBlocksCleared()] when events were lost before this one, else [].

        Each KV-cache event manager (one per attention DP rank) numbers its events from 0, the
        cache's "created", and TensorRT-LLM drops the oldest when more than
        event_buffer_max_size wait to be read. An event_id other than the one due (a gap, or a
        first event read that is not 0) means stores or evictions this bridge never saw, and no
        way to learn which. Subscribers are told to forget this replica's blocks: a router that
        believes a replica holds a prefix it evicted keeps sending that prefix's requests there,
        to be computed again, while one that believes too little only misses some hits, and the
        stores that follow rebuild its view. Translation goes on from this event."""
        if "event_id" not in event:
            return []  # a None event serializes to {}
        rank = event.get("attention_dp_rank")
        event_id = int(event["event_id"])
        due = self._next_ids.get(rank, 0)
        self._next_ids[rank] = event_id + 1
        if event_id == due:
            return []
        if event_id > due:
            what = f"{event_id - due} KV-cache events were dropped before event_id {event_id}"
        else:
            what = f"the KV-cache event ids went back from {due} to {event_id}"
        log.warning(
            "%s%s: TensorRT-LLM drops the oldest events when more than "
            "kv_cache_config.event_buffer_max_size (%d) wait to be read. Published "
            "AllBlocksCleared: subscribers forget this replica's blocks, and the stores that "
            "follow rebuild what they know (raise event_buffer_max_size in model.yaml if this "
            "repeats)",
            what,
            "" if rank is None else f" on attention DP rank {rank}",
            self._buffer_size,
        )
        self._partial.clear()  # their removals may be among the lost: nothing left to match
        return [AllBlocksCleared()]

    def _translate(self, event: dict[str, Any]) -> list[KvEvent]:
        window = int(event.get("window_size") or 0)
        if window < self._window:
            return []
        self._window = window
        data = event.get("data") or {}
        kind = data.get("type")
        if kind == "created":
            return [AllBlocksCleared()]
        if kind == "removed":
            hashes = [h for h in data.get("block_hashes", []) if h not in self._partial]
            self._partial.difference_update(data.get("block_hashes", []))
            return [BlockRemoved(hashes)] if hashes else []
        if kind != "stored":
            return []
        full = []
        for block in data.get("blocks") or []:
            if len(block.get("tokens") or []) < self._block_size:
                self._partial.add(block["block_hash"])
                break  # the blocks after a partial one have no full parent either
            full.append(block)
        if not full:
            return []
        tokens = [token["token_id"] for block in full for token in block["tokens"]]
        hashes = [block["block_hash"] for block in full]
        return [BlockStored(hashes, data.get("parent_hash"), tokens, self._block_size)]


def _perf(metrics: Any) -> engine.PerfMetrics | None:
    """CompletionOutput.request_perf_metrics (None unless return_perf_metrics was asked for)."""
    if metrics is None:
        return None
    timing = getattr(metrics, "timing_metrics", None)
    kv = getattr(metrics, "kv_cache_metrics", None)
    speculative = getattr(metrics, "speculative_decoding", None)
    return engine.PerfMetrics(
        arrival_time_ns=_ns(getattr(timing, "arrival_time", None)),
        first_scheduled_time_ns=_ns(getattr(timing, "first_scheduled_time", None)),
        first_token_time_ns=_ns(getattr(timing, "first_token_time", None)),
        last_token_time_ns=_ns(getattr(timing, "last_token_time", None)),
        kv_cache_reused_block=int(getattr(kv, "num_reused_blocks", 0) or 0),
        kv_cache_missed_block=int(getattr(kv, "num_missed_blocks", 0) or 0),
        kv_cache_alloc_new_blocks=int(getattr(kv, "num_new_allocated_blocks", 0) or 0),
        kv_cache_alloc_total_blocks=int(getattr(kv, "num_total_allocated_blocks", 0) or 0),
        kv_cache_hit_rate=float(getattr(kv, "kv_cache_hit_rate", 0.0) or 0.0),
        acceptance_rate=float(getattr(speculative, "acceptance_rate", 0.0) or 0.0),
        total_accepted_draft_tokens=int(
            getattr(speculative, "total_accepted_draft_tokens", 0) or 0
        ),
        total_draft_tokens=int(getattr(speculative, "total_draft_tokens", 0) or 0),
    )


def _ns(value: Any) -> int:
    """A timing as nanoseconds: the bindings give timedeltas (NVIDIA's model converts them with
    pandas); plain numbers are taken as seconds."""
    if value is None:
        return 0
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(microseconds=1) * 1000
    return int(float(value) * 1e9)
