"""A fake `tensorrt_llm`, built from the documented LLM API (tests/data/llmapi_python_api.json,
read from TensorRT-LLM 1.2's source), for running our llmapi model's adapter without a GPU.

What it holds to the letter, so that a call the real API would reject fails here too:
- SamplingParams, GuidedDecodingParams and LoRARequest are keyword-only dataclasses with exactly
  the documented fields (SamplingParams also its documented private init fields);
  GuidedDecodingParams takes one guide at most, LoRARequest's __post_init__ checks the path;
- LLM(...) takes the documented parameters and, as keywords, only documented LLM arguments;
- generate_async has exactly the documented parameters, and must be called with keywords only
  (NVIDIA's 1.2 model passed `streaming` positionally into `lora_request`); a prompt dict holds
  `prompt` or `prompt_token_ids` and only its documented keys, its `multi_modal_data` only
  documented modalities and element types;
- LLM.input_processor is a DefaultInputProcessor, or a multimodal one when `fake.multimodal` is
  set before the LLM is built; images sent to the default one fail (the real API drops them);
- RequestOutput / CompletionOutput have the documented attributes; a streaming RequestOutput is
  the same object updated in place at each yield, with `*_diff` properties, `abort()` ends it
  with finish_reason "cancelled", and a per-request failure raises RequestError on iteration;
- with kv_cache_config.event_buffer_max_size set, get_kv_cache_events_async yields the recorded
  KV-cache events (:func:`kv_event` builds each from the recorded schema, and they arrive as
  JSON-decoded dicts): "created" per attention window when the LLM is built, and, as each
  request finishes, its blocks (all but the last token, the last block maybe partial) "stored",
  blocks evicted to make room "removed" (least recently used leaves first), or, when
  `fake.kv_host_blocks` gives a host level, moved there and back as "updated" cache levels.
  `fake.kv_window_sizes` lists the attention windows: each has its own cache, the smaller ones
  fewer blocks, and one event_id counter numbers all their events. As recorded, the iterator
  waits up to `timeout` for each event, ends when none came, and stays ended until the next
  generate_async; when more than event_buffer_max_size events wait to be read, the oldest are
  dropped (a gap in event_id; `LLM.kv_events_dropped` counts them).

Its "model" is scripted: sequence i of a request emits the tokens 100 + 10 * i + step, each
step's log probs ranked (the token itself at rank 1), text "<id>" per token. Asked for context
logits, it returns :func:`context_logits` of the prompt (a torch tensor, as the PyTorch backend
does) with its first response, less the `reused_prompt_tokens` rows its KV cache would have
held (block reuse computes no logits for them).
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import datetime
import inspect
import json
import os
import sys
import types
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

API = json.loads((Path(__file__).parents[2] / "data" / "llmapi_python_api.json").read_text())
FAIL_TOKEN = 666  # a prompt holding this id fails while it generates (RequestError)
VOCAB = 1024


def context_logits(prompt: list[int]) -> Any:
    """The fake's prompt logits [len(prompt), VOCAB]: row t peaks at prompt[t] + 1."""
    import torch

    ids = torch.arange(VOCAB, dtype=torch.float32)
    return torch.stack([-((ids - (token + 1)) ** 2) / 50.0 for token in prompt])


def _default(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None  # "required" or a type name: no literal default


def _keyword_dataclass(name: str, fields: dict[str, dict[str, Any]], **namespace: Any) -> type:
    specs = []
    for field, spec in fields.items():
        default = spec.get("default", "None")
        if default == "required":
            specs.append((field, Any))
        else:
            value = _default(default)
            specs.append((field, Any, dataclasses.field(default_factory=lambda v=value: v)))
    return dataclasses.make_dataclass(name, specs, kw_only=True, namespace=namespace)


def _guided_post_init(self: Any) -> None:
    given = [f for f in ("json", "regex", "grammar", "structural_tag") if getattr(self, f)]
    given += ["json_object"] if self.json_object else []
    if len(given) > 1:
        raise ValueError(f"only one guide may be set, got {given}")


def _lora_post_init(self: Any) -> None:
    if not os.path.exists(self.lora_path):
        raise ValueError(f"lora_path ({self.lora_path}) does not exist.")


class DefaultInputProcessor:
    """tensorrt_llm.inputs.registry.DefaultInputProcessor: a text-only model's (tokenizes)."""


class BaseMultimodalInputProcessor:
    """tensorrt_llm.inputs.registry.BaseMultimodalInputProcessor: a vision-language model's."""


def _is_a(item: Any, names: list[str]) -> bool:
    """Whether `item` is an instance of one of the classes named `module.QualName`."""
    return any(f"{c.__module__}.{c.__qualname__}" in names for c in type(item).__mro__)


def _prompt_ids(inputs: Any, input_processor: Any) -> list[int]:
    """The prompt's token ids (a text prompt is "tokenized" one id per character), after the
    checks the contract allows: a TextPrompt or TokensPrompt dict with its documented keys, and
    multi_modal_data with documented modalities and element types."""
    if isinstance(inputs, str):
        return [ord(c) for c in inputs]
    if isinstance(inputs, list):
        return list(inputs)
    if ("prompt" in inputs) == ("prompt_token_ids" in inputs):
        raise TypeError(f"a prompt dict holds prompt or prompt_token_ids: {sorted(inputs)}")
    text = "prompt" in inputs
    allowed = API["PromptInputs"]["TextPrompt_keys" if text else "TokensPrompt_keys"]
    if unknown := set(inputs) - set(allowed):
        raise TypeError(f"unknown prompt keys {sorted(unknown)}")
    media = inputs.get("multi_modal_data") or {}
    multimodal = API["multimodal"]
    for modality, items in media.items():
        if modality not in multimodal["modalities"]:
            raise ValueError(f"unknown modality {modality!r}")
        if modality == "image" and not all(_is_a(i, multimodal["image_types"]) for i in items):
            raise TypeError(f"images must be one of {multimodal['image_types']}")
    if media and isinstance(input_processor, DefaultInputProcessor):
        raise AssertionError("media sent to a text-only model: the LLM API would drop them")
    return [ord(c) for c in inputs["prompt"]] if text else list(inputs["prompt_token_ids"])


class RequestError(RuntimeError):
    """tensorrt_llm.executor.utils.RequestError: one request failed."""


@dataclasses.dataclass
class Logprob:
    logprob: float
    rank: int | None


class CompletionOutput:
    """Documented attributes; *_diff hold what arrived since the previous yield."""

    def __init__(self, index: int) -> None:
        for name in API["CompletionOutput"]:
            if name not in ("length", "text_diff", "token_ids_diff", "logprobs_diff"):
                setattr(self, name, None)
        self.index = index
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[Any] = []
        self.prompt_logprobs: list[Any] = []
        self._last_token_ids_len = 0
        self._last_logprobs_len = 0
        self._last_text_len = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]

    @property
    def logprobs_diff(self) -> list[Any]:
        return self.logprobs[self._last_logprobs_len :]


class RequestOutput:
    """One request: updated in place by its generation task, iterated by the caller."""

    def __init__(
        self,
        fake: types.ModuleType,
        prompt_ids: list[int],
        params: Any,
        on_finish: Callable[[list[int]], None] | None = None,
    ) -> None:
        for name in API["RequestOutput"]:
            if name not in ("abort", "aborted", "result", "aresult"):
                setattr(self, name, None)
        self._fake = fake
        self.prompt_token_ids = prompt_ids
        self.sampling_params = params
        self.outputs = [CompletionOutput(i) for i in range(params.n)]
        self.finished = False
        self.cached_tokens = 3
        self._aborted = False
        self._on_finish = on_finish  # called with the finished sequence (sequence 0)
        self._queue: asyncio.Queue[None] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._generate())
        self._error: BaseException | None = None

    def abort(self) -> None:
        self._aborted = True
        self._fake.aborted.append(self)

    def aborted(self) -> bool:
        return self._aborted

    async def _generate(self) -> None:
        params = self.sampling_params
        step = 0
        while True:
            await asyncio.sleep(self._fake.step_s)
            if FAIL_TOKEN in self.prompt_token_ids and step == 2:
                self._error = RequestError("the executor failed on this request")
                self._queue.put_nowait(None)
                return
            if step == 0 and params.return_context_logits:
                rows = len(self.prompt_token_ids) - self._fake.reused_prompt_tokens
                self.context_logits = context_logits(self.prompt_token_ids)[-rows:]
            for output in self.outputs:
                output._last_token_ids_len = len(output.token_ids)
                output._last_logprobs_len = len(output.logprobs)
                output._last_text_len = len(output.text)
                if self._aborted:
                    output.finish_reason = "cancelled"
                    continue
                token = 100 + 10 * output.index + step
                output.token_ids.append(token)
                output.text += f"<{token}>" if params.detokenize else ""
                if params.logprobs is not None:
                    k = max(params.logprobs, 1)
                    ranked = {token: Logprob(-0.25, 1)}
                    ranked |= {token + 1000 + j: Logprob(-1.0 - j, 2 + j) for j in range(k - 1)}
                    output.logprobs.append(ranked)
                output.cumulative_logprob = -0.25 * len(output.token_ids)
                if len(output.token_ids) >= params.max_tokens:
                    output.finish_reason = "length"
                if output.finish_reason is not None and params.return_perf_metrics:
                    output.request_perf_metrics = _perf_metrics()
            step += 1
            finished = all(o.finish_reason is not None for o in self.outputs)
            if finished and self._on_finish is not None:
                self._on_finish(self.prompt_token_ids + self.outputs[0].token_ids)
            self.finished = finished
            self._queue.put_nowait(None)
            if self.finished:
                return

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished and self._queue.empty():
            raise StopAsyncIteration
        await self._queue.get()
        if self._error is not None:
            raise self._error
        return self

    async def aresult(self) -> RequestOutput:
        await self._task
        if self._error is not None:
            raise self._error
        return self

    def result(self, timeout: float | None = None) -> RequestOutput:
        raise NotImplementedError("the model calls aresult() on its event loop")


def _perf_metrics() -> Any:
    timing = types.SimpleNamespace(
        **dict.fromkeys(API["request_perf_metrics"]["timing_metrics"], None)
    )
    timing.arrival_time = datetime.timedelta(seconds=1, microseconds=5)
    timing.first_scheduled_time = datetime.timedelta(seconds=1, microseconds=7)
    timing.first_token_time = datetime.timedelta(seconds=2)
    timing.last_token_time = datetime.timedelta(seconds=3)
    kv = types.SimpleNamespace(**dict.fromkeys(API["request_perf_metrics"]["kv_cache_metrics"], 0))
    kv.num_reused_blocks, kv.kv_cache_hit_rate = 2, 0.5
    speculative = types.SimpleNamespace(
        **dict.fromkeys(API["request_perf_metrics"]["speculative_decoding"], 0)
    )
    return types.SimpleNamespace(
        timing_metrics=timing, kv_cache_metrics=kv, speculative_decoding=speculative
    )


KV_EVENTS = API["kv_cache_events"]
PRIMARY, SECONDARY = 0, 1  # cache levels: GPU, host
DEFAULT_PRIORITY = 35  # a stored block's retention priority unless the request sets one
DEFAULT_WINDOW = 2048  # the fake's attention window (a model without sliding windows: max_seq_len)
DEFAULT_GPU_BLOCKS = 64  # per window, without kv_cache_config.max_tokens
_HASH_MASK = (1 << 64) - 1  # block hashes are uint64


def kv_event(kind: str, **fields: Any) -> dict[str, Any]:
    """One dict of TensorRT-LLM's KV-cache events as KVCacheEventSerializer writes it, from the
    recorded schema: `kind` is a data type (created, stored, removed, updated), a part
    (stored_block, unique_token, event_diff) or "event" (the envelope, whose optional keys may be
    given too). Exactly the recorded keys, in their order; a missing or unknown one fails."""
    if kind == "event":
        schema: dict[str, Any] = dict.fromkeys(KV_EVENTS["envelope"])
        optional = set(KV_EVENTS["envelope_optional"])
    else:
        schema = KV_EVENTS["data"].get(kind) or KV_EVENTS["parts"][kind]
        optional = set()
    required = set(schema) - {"type"}
    if missing := required - set(fields):
        raise TypeError(f"a {kind} event lacks {sorted(missing)}")
    if unknown := set(fields) - required - optional:
        raise TypeError(f"a {kind} event has no {sorted(unknown)}")
    event = {name: schema["type"] if name == "type" else fields[name] for name in schema}
    return event | {name: fields[name] for name in sorted(optional & set(fields))}


def stored_block(block_hash: int, tokens: list[int], level: int = PRIMARY) -> dict[str, Any]:
    """A "stored" event's block: its text tokens (token_extra_id 0), default priority."""
    unique = [kv_event("unique_token", token_id=t, token_extra_id=0) for t in tokens]
    return kv_event("stored_block", block_hash=block_hash, tokens=unique, cache_level=level,
                    priority=DEFAULT_PRIORITY)  # fmt: skip


def level_change(block_hash: int, old: int, new: int) -> dict[str, Any]:
    """An "updated" event's data for a block moved between cache levels (priority unchanged)."""
    return kv_event(
        "updated",
        block_hash=block_hash,
        cache_level=kv_event("event_diff", new_value=new, old_value=old),
        priority=kv_event("event_diff", new_value=DEFAULT_PRIORITY, old_value=DEFAULT_PRIORITY),
    )


@dataclasses.dataclass
class KvBlock:
    parent: int | None
    tokens: list[int]
    level: int = PRIMARY


class KvCache:
    """One attention window's block manager, as its events tell it: a tree of reusable blocks
    (hash: the parent's and the block's tokens), GPU blocks and optionally host blocks. A block
    that needs room evicts the least recently used one outside its own chain, a leaf first: to
    the host level when there is one ("updated"), else out ("removed"); a host block it
    displaces goes out. A reused host block comes back to the GPU ("updated")."""

    def __init__(self, tokens_per_block: int, gpu_blocks: int, host_blocks: int,
                 emit: Callable[[dict[str, Any]], None]) -> None:  # fmt: skip
        self.tokens_per_block = tokens_per_block
        self.capacity = {PRIMARY: gpu_blocks, SECONDARY: host_blocks}
        self.blocks: dict[int, KvBlock] = {}
        self._recent: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._emit = emit

    def held(self) -> dict[int, int]:
        """What the cache holds, at either level: block hash -> its number of tokens."""
        return {block_hash: len(block.tokens) for block_hash, block in self.blocks.items()}

    def store(self, tokens: list[int]) -> None:
        chain: list[int] = []
        new: list[int] = []
        parent = None
        for start in range(0, len(tokens), self.tokens_per_block):
            chunk = tokens[start : start + self.tokens_per_block]
            block_hash = hash((parent, tuple(chunk))) & _HASH_MASK
            block = self.blocks.get(block_hash)
            if block is None or block.level == SECONDARY:
                if not self._make_room(PRIMARY, [*chain, block_hash]):
                    break  # the chain fills the cache: the rest is not kept
                if block is None:
                    self.blocks[block_hash] = KvBlock(parent, chunk)
                    new.append(block_hash)
                else:
                    block.level = PRIMARY
                    self._emit(level_change(block_hash, SECONDARY, PRIMARY))
            self._recent[block_hash] = None
            self._recent.move_to_end(block_hash)
            chain.append(block_hash)
            parent = block_hash
        if new:
            blocks = [stored_block(h, self.blocks[h].tokens) for h in new]
            self._emit(kv_event("stored", parent_hash=self.blocks[new[0]].parent, blocks=blocks))

    def _make_room(self, level: int, keep: list[int]) -> bool:
        while sum(block.level == level for block in self.blocks.values()) >= self.capacity[level]:
            parents = {block.parent for block in self.blocks.values()}
            candidates = [
                h for h in self._recent if self.blocks[h].level == level and h not in keep
            ]
            if not candidates:
                return False
            victim = next((h for h in candidates if h not in parents), candidates[0])
            if level == PRIMARY and self.capacity[SECONDARY]:
                if not self._make_room(SECONDARY, keep):
                    return False
                self.blocks[victim].level = SECONDARY
                self._emit(level_change(victim, PRIMARY, SECONDARY))
            else:
                self._remove(victim)
        return True

    def _remove(self, victim: int) -> None:
        """The block out of the cache, with its descendants (deepest first): one event."""
        gone = [victim]
        for position in range(len(self.blocks)):
            if position == len(gone):
                break
            gone += [h for h, block in self.blocks.items() if block.parent == gone[position]]
        for block_hash in reversed(gone):
            del self.blocks[block_hash]
            del self._recent[block_hash]
        self._emit(kv_event("removed", block_hashes=list(reversed(gone))))


def _signature(names: list[str], first_required: int) -> inspect.Signature:
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for position, name in enumerate(names):
        if name == "**kwargs":
            parameters.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
            continue
        default = inspect.Parameter.empty if position < first_required else None
        parameters.append(
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
        )
    return inspect.Signature(parameters)


class LLM:
    """tensorrt_llm.LLM: the documented constructor, generate_async and KV-cache events."""

    _init_signature = _signature(API["LLM_init"], 1)
    _generate_signature = _signature(API["generate_async"], 1)
    _events_signature = _signature(API["get_kv_cache_events_async"], 0)
    _events_sync_signature = _signature(API["get_kv_cache_events"], 0)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = self._init_signature.bind(self, *args, **kwargs)
        extra = bound.arguments.get("kwargs", {})
        unknown = set(extra) - set(API["llm_args"]) - {"backend"}
        if unknown:
            raise ValueError(f"LLM got invalid argument: {sorted(unknown)}")
        self.args = {k: v for k, v in bound.arguments.items() if k not in ("self", "kwargs")}
        self.args.update(extra)
        self.shut_down = False
        processor = BaseMultimodalInputProcessor if fake.multimodal else DefaultInputProcessor
        self.input_processor = processor()
        self.kv_events: list[dict[str, Any]] = []  # queued for get_kv_cache_events_async
        self.kv_event_log: list[dict[str, Any]] = []  # every event queued, for the tests
        self.kv_events_dropped = 0  # the oldest, when more than event_buffer_max_size waited
        self._kv_queued = asyncio.Event()
        self._kv_iteration: KvEventIteration | None = None  # built by the first generate_async
        self.kv_caches: dict[int, KvCache] = {}  # attention window -> its cache
        self._next_event_id = 0
        if self._kv_config("event_buffer_max_size"):
            self._build_kv_caches()
        fake.llms.append(self)

    def _kv_config(self, name: str) -> Any:
        """A KvCacheConfig field (a recorded one) as model.yaml set it, else its default."""
        default = API["llm_args"][f"kv_cache_config.{name}"]
        config = self.args.get("kv_cache_config") or {}
        return config.get(name, default) if isinstance(config, dict) else default

    def _build_kv_caches(self) -> None:
        size = int(self._kv_config("tokens_per_block"))
        max_tokens = self._kv_config("max_tokens")
        gpu = int(max_tokens) // size if max_tokens else DEFAULT_GPU_BLOCKS
        windows = list(fake.kv_window_sizes)
        for window in windows:
            blocks = max(1, gpu * window // max(windows))
            self._queue_kv_event(kv_event("created", num_blocks_per_cache_level=[
                blocks, fake.kv_host_blocks]), window)  # fmt: skip
            if self._kv_config("enable_block_reuse"):
                emit = lambda data, w=window: self._queue_kv_event(data, w)  # noqa: E731
                self.kv_caches[window] = KvCache(size, blocks, fake.kv_host_blocks, emit)

    def _queue_kv_event(self, data: dict[str, Any], window: int) -> None:
        """Queued as the engine does: consecutive removals of one window make one event."""
        last = self.kv_events[-1] if self.kv_events else None
        if (data["type"] == "removed" and last is not None and last["window_size"] == window
                and last["data"]["type"] == "removed"):  # fmt: skip
            last["data"]["block_hashes"] += data["block_hashes"]
            return
        event = kv_event("event", event_id=self._next_event_id, data=data, window_size=window)
        self._next_event_id += 1
        self.kv_events.append(event)
        self.kv_event_log.append(event)
        overflow = len(self.kv_events) - int(self._kv_config("event_buffer_max_size"))
        if overflow > 0:
            del self.kv_events[:overflow]
            self.kv_events_dropped += overflow
        self._kv_queued.set()

    def _store_kv_blocks(self, sequence: list[int]) -> None:
        for cache in self.kv_caches.values():
            cache.store(sequence[:-1])  # the last token's KV is not kept for reuse

    def generate_async(self, *args: Any, **kwargs: Any) -> RequestOutput:
        if args:
            raise TypeError(f"generate_async called with {len(args)} positional argument(s)")
        bound = self._generate_signature.bind(self, **kwargs)
        if self.shut_down:
            raise RuntimeError("LLM is shutting down")
        call = {k: v for k, v in bound.arguments.items() if k != "self"}
        fake.calls.append(call)
        prompt_ids = _prompt_ids(call["inputs"], self.input_processor)
        params = call.get("sampling_params") or SamplingParams()
        if self._kv_iteration is None:
            self._kv_iteration = KvEventIteration(self)
        self._kv_iteration.done = False  # IterationResult.mark_undone: new prompts, new events
        return RequestOutput(fake, prompt_ids, params, on_finish=self._store_kv_blocks)

    def get_kv_cache_events_async(self, *args: Any, **kwargs: Any) -> KvEventIteration:
        """The one iterator of the queued events (its timeout set), each as the LLM API gives
        it (json.loads of the serialized event)."""
        bound = self._events_signature.bind(self, *args, **kwargs)
        iteration = self._check_events_exist()
        iteration.timeout = bound.arguments.get("timeout", 2)
        return iteration

    def get_kv_cache_events(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        """Every queued event at once (the adapter reads the async iterator)."""
        self._events_sync_signature.bind(self, *args, **kwargs)
        self._check_events_exist()
        events, self.kv_events = self.kv_events, []
        return json.loads(json.dumps(events))

    def _check_events_exist(self) -> KvEventIteration:
        if self._kv_iteration is None:  # the executor builds its event queue on the first request
            raise AssertionError("KV Event IterationResult is not properly instantiated.")
        return self._kv_iteration

    async def _next_kv_event(self) -> dict[str, Any]:
        while not self.kv_events:
            self._kv_queued.clear()
            await self._kv_queued.wait()
        return json.loads(json.dumps(self.kv_events.pop(0)))

    def shutdown(self) -> None:
        self.shut_down = True


class KvEventIteration:
    """The LLM API's IterationResult of KV-cache events: each next event waits up to `timeout`
    seconds; when none came, the iteration ends, and stays ended (for every caller of
    get_kv_cache_events_async) until the next generate_async."""

    def __init__(self, llm: LLM) -> None:
        self._llm = llm
        self.timeout: float | None = 2
        self.done = False

    def __aiter__(self) -> KvEventIteration:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self.done:
            raise StopAsyncIteration
        try:
            return await asyncio.wait_for(self._llm._next_kv_event(), self.timeout)
        except TimeoutError:
            self.done = True
            raise StopAsyncIteration from None


SamplingParams = _keyword_dataclass(
    "SamplingParams",
    {
        **API["SamplingParams"],
        **{k: v for k, v in API["SamplingParams_private"].items() if v.get("init")},
    },
)
GuidedDecodingParams = _keyword_dataclass(
    "GuidedDecodingParams", API["GuidedDecodingParams"], __post_init__=_guided_post_init
)
LoRARequest = _keyword_dataclass("LoRARequest", API["LoRARequest"], __post_init__=_lora_post_init)


def _module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


fake = _module(
    "tensorrt_llm",
    __version__="1.2.1-fake",
    LLM=LLM,
    SamplingParams=SamplingParams,
    calls=[],
    llms=[],
    aborted=[],
    step_s=0.001,
    multimodal=False,  # the next LLM built is a vision-language model's
    kv_window_sizes=(DEFAULT_WINDOW,),  # the next LLM's attention windows
    kv_host_blocks=0,  # the next LLM's host (secondary) blocks per window
)
MODULES = {
    "tensorrt_llm": fake,
    "tensorrt_llm.sampling_params": _module(
        "tensorrt_llm.sampling_params",
        SamplingParams=SamplingParams,
        GuidedDecodingParams=GuidedDecodingParams,
    ),
    "tensorrt_llm.executor": _module("tensorrt_llm.executor"),
    "tensorrt_llm.executor.request": _module(
        "tensorrt_llm.executor.request", LoRARequest=LoRARequest
    ),
    "tensorrt_llm.executor.utils": _module(
        "tensorrt_llm.executor.utils", RequestError=RequestError
    ),
    "tensorrt_llm.inputs": _module("tensorrt_llm.inputs"),
    "tensorrt_llm.inputs.registry": _module(
        "tensorrt_llm.inputs.registry",
        DefaultInputProcessor=DefaultInputProcessor,
        BaseMultimodalInputProcessor=BaseMultimodalInputProcessor,
    ),
}


def install(monkeypatch: Any) -> types.ModuleType:
    """Put the fake in sys.modules (fresh call records) and return it."""
    for name, module in MODULES.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(fake, "calls", [])
    monkeypatch.setattr(fake, "llms", [])
    monkeypatch.setattr(fake, "aborted", [])
    monkeypatch.setattr(fake, "reused_prompt_tokens", 0, raising=False)
    monkeypatch.setattr(fake, "multimodal", False)
    monkeypatch.setattr(fake, "kv_window_sizes", (DEFAULT_WINDOW,))
    monkeypatch.setattr(fake, "kv_host_blocks", 0)
    monkeypatch.delitem(
        sys.modules, "tensorrtllm_backend.python_models.llmapi.trtllm", raising=False
    )
    return fake
