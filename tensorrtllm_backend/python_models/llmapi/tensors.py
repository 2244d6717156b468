"""The llmapi model's tensors: a Triton request -> an EngineRequest; steps -> Triton responses.

The inputs are a strict superset of NVIDIA's llmapi config.pbtxt (max_batch_size 0: no batch
dimension, scalars are [1]). Naming: `sampling_param_<field>` sets the SamplingParams field of
that name; the C++ backend's names are kept for what it already names (`input_ids`,
`output_ids`, `sequence_index`, `output_log_probs`, `guided_decoding_guide_type` /
`guided_decoding_guide`); NVIDIA's `lora_*` select an adapter.

Two kinds of request, told apart by the prompt:
- text (`text_input`), NVIDIA's: each response holds every sequence's text so far
  (`text_output`, one entry per sequence, the prompt first unless
  `sampling_param_exclude_input_from_output`), plus `finish_reason` / `stop_reason` /
  `cumulative_logprob` when their `return_*` flag is set;
- token ids (`input_ids`, and `text_input` left empty): one response per sequence that moved,
  with the new token ids (`output_ids`) and its `sequence_index`, its log probs and top-k
  alternatives (`sampling_param_logprobs`), and the same optional outputs.
Every sequence's last response also carries `cached_tokens`, and the perf metrics when
`sampling_param_return_perf_metrics` is set. pb_utils exists only inside the stub, so it is
passed in (`pb`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...common.media import ImageBudget, MediaError, image_from_url
from ..cpu_engine.triton_io import guide_of
from ..prompt_scores import OUTPUTS as PROMPT_OUTPUTS
from ..request_error import RequestError
from ..stub_settings import media_limits
from .engine import (
    EngineRequest,
    Guide,
    LoraSpec,
    PerfMetrics,
    Sampling,
    SequenceStep,
    Step,
)

DEFAULT_MAX_TOKENS = 32  # the LLM API's SamplingParams default
MAX_SEQUENCES = 64
MAX_LOGPROBS = 20

# sampling_param_<field> scalars, with the type their value takes.
_SCALARS: dict[str, type] = {
    "temperature": float,
    "top_k": int,
    "top_p": float,
    "frequency_penalty": float,
    "presence_penalty": float,
    "repetition_penalty": float,
    "length_penalty": float,
    "seed": int,
    "min_tokens": int,
    "n": int,
    "best_of": int,
    "end_id": int,
    "pad_id": int,
    "ignore_eos": bool,
    "logprobs": int,
    "prompt_logprobs": int,
    "return_perf_metrics": bool,
}
_STRING_LISTS = ("stop", "bad")
_ID_LISTS = ("stop_token_ids", "bad_token_ids")
# NVIDIA's perf outputs, PerfMetrics' fields: (name, dtype, one value per sequence (the KV-cache
# ones) or the request's). Their dtypes follow the names: int64 times, float32 rates, int32 counts.
_PERF_OUTPUTS = tuple(
    (
        f.name,
        np.int64
        if f.name.endswith("_ns")
        else np.float32
        if f.name.endswith("_rate")
        else np.int32,
        f.name.startswith("kv_cache_"),
    )
    for f in dataclasses.fields(PerfMetrics)
)
# [i] int32 arrays for sequence_index, built once and never mutated (one per response).
_INDEXES = tuple(np.array([i], dtype=np.int32) for i in range(MAX_SEQUENCES))


class _Inputs:
    """One request's inputs (shape [1] scalars, [-1] lists)."""

    def __init__(self, pb: Any, request: Any) -> None:
        self._pb = pb
        self._request = request

    def array(self, name: str) -> np.ndarray | None:
        tensor = self._pb.get_input_tensor_by_name(self._request, name)
        return None if tensor is None else tensor.as_numpy()

    def scalar(self, name: str, kind: type, default: Any = None) -> Any:
        value = self.array(name)
        if value is None or value.size == 0:
            return default
        if value.size != 1:
            raise RequestError(f"input '{name}' must hold one value, got shape {value.shape}")
        item = value.reshape(-1)[0]
        if isinstance(item, bytes):
            return _text(item, name)
        return kind(item.item())

    def strings(self, name: str) -> list[str]:
        value = self.array(name)
        if value is None:
            return []
        return [_text(v, name) if isinstance(v, bytes) else str(v) for v in value.reshape(-1)]

    def ids(self, name: str) -> list[int]:
        value = self.array(name)
        return [] if value is None else [int(v) for v in value.reshape(-1)]


def _text(value: bytes, name: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError(f"input '{name}' is not UTF-8 text") from None


@dataclass(slots=True)
class ParsedRequest:
    """An EngineRequest and how its responses are shaped."""

    request: EngineRequest
    token_ids: bool  # the prompt came as input_ids: token-id deltas out
    prompt_text: str = ""  # prepended to text_output unless the input is excluded
    prompt_ids: list[int] = field(default_factory=list)  # prepended to output_ids likewise
    finish_reason: bool = False
    stop_reason: bool = False
    cumulative_logprob: bool = False
    logprobs: int | None = None  # alternatives per token (0: the chosen token's only)
    perf: bool = False
    scores_sent: bool = False  # the prompt's scores went out (with the first response after)
    image_urls: list[str] = field(default_factory=list)  # NVIDIA's image_url: read before it runs


def is_stop_request(pb: Any, request: Any) -> bool:
    """`stop` = true: cancel the in-flight requests with this request's id."""
    return bool(_Inputs(pb, request).scalar("stop", bool, False))


def parse_request(pb: Any, request: Any, *, decoupled: bool, return_perf: bool) -> ParsedRequest:
    """Validate a request's tensors (RequestError names the input to fix). `return_perf`: the
    LLM's own return_perf_metrics, ORed into every request's as the LLM API does."""
    inputs = _Inputs(pb, request)
    ids = inputs.ids("input_ids")
    texts = inputs.strings("text_input")
    if ids:
        if any(texts):
            raise RequestError("send the prompt once: input_ids, or text_input (then left empty)")
        prompt: str | list[int] = ids
    else:
        if len(texts) != 1 or not texts[0]:
            raise RequestError("text_input must hold one non-empty prompt (or send input_ids)")
        prompt = texts[0]
    streaming = bool(inputs.scalar("streaming", bool, False))
    if streaming and not decoupled:
        raise RequestError("Streaming is only supported in decoupled mode")
    values = {
        name: inputs.scalar(f"sampling_param_{name}", kind) for name, kind in _SCALARS.items()
    }
    values = {name: value for name, value in values.items() if value is not None}
    values["return_perf_metrics"] = bool(values.get("return_perf_metrics")) or return_perf
    sampling = Sampling(
        max_tokens=int(inputs.scalar("sampling_param_max_tokens", int, DEFAULT_MAX_TOKENS)),
        **values,
        **{name: inputs.strings(f"sampling_param_{name}") for name in _STRING_LISTS},
        **{name: inputs.ids(f"sampling_param_{name}") for name in _ID_LISTS},
        detokenize=not ids,
        guide=_guide(inputs),
    )
    _check(sampling)
    token_ids = bool(ids)
    if sampling.prompt_logprobs is not None and not token_ids:
        raise RequestError("sampling_param_prompt_logprobs needs the prompt as input_ids")
    if token_ids and sampling.n > 1 and not decoupled:
        raise RequestError(
            "sampling_param_n > 1 with input_ids needs the decoupled transaction policy "
            "(one response per sequence)"
        )
    exclude = bool(inputs.scalar("sampling_param_exclude_input_from_output", bool, False))
    return ParsedRequest(
        request=EngineRequest(
            prompt=prompt,
            sampling=sampling,
            streaming=streaming,
            lora=_lora(inputs),
            request_id=request.request_id() or "",
            images=_images(inputs),
        ),
        image_urls=[url for url in inputs.strings("image_url") if url],
        token_ids=token_ids,
        prompt_text="" if exclude or token_ids else str(prompt),
        prompt_ids=[] if exclude or not token_ids else ids,
        finish_reason=bool(inputs.scalar("return_finish_reason", bool, False)),
        stop_reason=bool(inputs.scalar("return_stop_reason", bool, False)),
        cumulative_logprob=bool(inputs.scalar("return_cumulative_logprob", bool, False)),
        logprobs=sampling.logprobs,
        perf=sampling.return_perf_metrics,
    )


def _images(inputs: _Inputs) -> list[bytes]:
    """The `images` input: encoded images (empty entries are none)."""
    value = inputs.array("images")
    return [] if value is None else [bytes(item) for item in value.reshape(-1) if len(item)]


def load_image_urls(urls: list[str], given: int) -> list[bytes]:
    """NVIDIA's `image_url` input read (data: URIs; http(s) of TRTLLM_ALLOWED_MEDIA_DOMAINS'
    hosts) within the service's image limits, `given` images having come as `images`
    (blocking: fetches)."""
    limits = media_limits()
    budget = ImageBudget(limits)
    found = []
    try:
        budget.check_count(given + len(urls), "image_url")
        for index, url in enumerate(urls):
            image = image_from_url(url, limits, where=f"image_url[{index}]")
            budget.add(image, f"image_url[{index}]")
            found.append(image.data)
    except MediaError as error:
        raise RequestError(f"input {error}") from None
    return found


def _check(sampling: Sampling) -> None:
    """What SamplingParams would reject, as a message naming the input."""
    checks = (
        (sampling.max_tokens >= 1, "sampling_param_max_tokens must be at least 1"),
        (1 <= sampling.n <= MAX_SEQUENCES, f"sampling_param_n must be 1 to {MAX_SEQUENCES}"),
        (
            sampling.best_of is None or sampling.best_of >= sampling.n,
            "sampling_param_best_of must be at least sampling_param_n",
        ),
        (
            sampling.logprobs is None or 0 <= sampling.logprobs <= MAX_LOGPROBS,
            f"sampling_param_logprobs must be 0 to {MAX_LOGPROBS}",
        ),
        (
            sampling.prompt_logprobs is None or 0 <= sampling.prompt_logprobs <= MAX_LOGPROBS,
            f"sampling_param_prompt_logprobs must be 0 to {MAX_LOGPROBS}",
        ),
        (sampling.top_k is None or sampling.top_k >= 0, "sampling_param_top_k must be >= 0"),
        (
            sampling.top_p is None or 0.0 <= sampling.top_p <= 1.0,
            "sampling_param_top_p must be 0 to 1",
        ),
        (
            sampling.temperature is None or sampling.temperature >= 0.0,
            "sampling_param_temperature must be >= 0",
        ),
        (
            sampling.min_tokens is None or 0 <= sampling.min_tokens <= sampling.max_tokens,
            "sampling_param_min_tokens must be 0 to sampling_param_max_tokens",
        ),
    )
    for ok, message in checks:
        if not ok:
            raise RequestError(message)


def _guide(inputs: _Inputs) -> Guide | None:
    """The C++ backend's guide tensors, checked as the CPU engine checks them."""
    try:
        found = guide_of(
            inputs.scalar("guided_decoding_guide_type", str) or None,
            inputs.scalar("guided_decoding_guide", str) or None,
        )
    except ValueError as error:
        raise RequestError(str(error)) from None
    return None if found is None else Guide(*found)


def _lora(inputs: _Inputs) -> LoraSpec | None:
    """NVIDIA's lora_id, lora_name and lora_path go together (lora_ckpt_source: "hf")."""
    lora_id = inputs.scalar("lora_id", int)
    name = inputs.scalar("lora_name", str)
    path = inputs.scalar("lora_path", str)
    given = [value is not None for value in (lora_id, name, path)]
    if not any(given):
        return None
    if not all(given):
        raise RequestError("lora_id, lora_name and lora_path go together: send all three")
    source = inputs.scalar("lora_ckpt_source", str) or "hf"
    return LoraSpec(name=name, int_id=int(lora_id), path=path, ckpt_source=source)


# -- responses ------------------------------------------------------------------------------------


Outgoing = tuple[Any, list[Any]]
"""A response and its tensors. Whoever sends the response holds the tensors until the send
returns: the Python 3.12 stub of Triton 2.51 drops its own references to a response's tensors
with the GIL released, and a tensor whose last reference goes there crashes the stub
(a segfault in libpython, seen on the GPU host; the 3.11 stub tolerates it)."""


def _strings(values: list[str]) -> np.ndarray:
    return np.array([value.encode() for value in values], dtype=np.object_)


def text_response(pb: Any, step: Step, parsed: ParsedRequest) -> Outgoing:
    """NVIDIA's response: every sequence's text so far, and the outputs asked for."""
    sequences = step.sequences
    tensors = [pb.Tensor("text_output", _strings([parsed.prompt_text + s.text for s in sequences]))]
    if parsed.finish_reason:
        tensors.append(
            pb.Tensor("finish_reason", _strings([str(s.finish_reason) for s in sequences]))
        )
    if parsed.stop_reason:
        tensors.append(pb.Tensor("stop_reason", _strings([str(s.stop_reason) for s in sequences])))
    if parsed.cumulative_logprob:
        tensors.append(
            pb.Tensor(
                "cumulative_logprob", np.array([_cumulative(s) for s in sequences], np.float32)
            )
        )
    if step.finished:
        tensors.append(pb.Tensor("cached_tokens", np.array([step.cached_tokens], np.int32)))
        if parsed.perf:
            tensors += _perf(pb, [s.perf or PerfMetrics() for s in sequences])
    return pb.InferenceResponse(output_tensors=tensors), tensors


def token_response(pb: Any, sequence: SequenceStep, parsed: ParsedRequest, step: Step) -> Outgoing:
    """One sequence's new tokens (`output_ids`, `sequence_index`) and the outputs asked for; its
    last response also carries cached_tokens (and the perf metrics when asked for)."""
    ids = sequence.token_ids
    if parsed.prompt_ids:  # the prompt goes out before the sequence's first token
        ids, parsed.prompt_ids = parsed.prompt_ids + ids, []
    index = sequence.index
    tensors = [
        pb.Tensor("output_ids", np.array(ids, dtype=np.int32)),
        pb.Tensor(
            "sequence_index",
            _INDEXES[index] if index < MAX_SEQUENCES else np.array([index], np.int32),
        ),
    ]
    k = parsed.logprobs
    if k is not None:
        tensors.append(
            pb.Tensor("output_log_probs", np.array(sequence.logprobs or [], dtype=np.float32))
        )
        if k > 0:
            top = sequence.top or []
            tensors.append(
                pb.Tensor(
                    "output_top_token_ids",
                    np.array([entry[0] for entry in top], dtype=np.int32).reshape(len(top), k),
                )
            )
            tensors.append(
                pb.Tensor(
                    "output_top_log_probs",
                    np.array([entry[1] for entry in top], dtype=np.float32).reshape(len(top), k),
                )
            )
    if parsed.finish_reason:
        tensors.append(pb.Tensor("finish_reason", _strings([str(sequence.finish_reason)])))
    if parsed.stop_reason:
        tensors.append(pb.Tensor("stop_reason", _strings([str(sequence.stop_reason)])))
    if parsed.cumulative_logprob:
        tensors.append(
            pb.Tensor("cumulative_logprob", np.array([_cumulative(sequence)], np.float32))
        )
    if step.prompt_scores is not None and not parsed.scores_sent:
        tensors += [
            pb.Tensor(name, array)
            for name, array in zip(PROMPT_OUTPUTS, step.prompt_scores, strict=True)
        ]
        parsed.scores_sent = True
    if sequence.finished:
        tensors.append(pb.Tensor("cached_tokens", np.array([step.cached_tokens], np.int32)))
        if parsed.perf:
            tensors += _perf(pb, [sequence.perf or PerfMetrics()])
    return pb.InferenceResponse(output_tensors=tensors), tensors


def _cumulative(sequence: SequenceStep) -> float:
    value = sequence.cumulative_logprob
    return float("nan") if value is None else value  # the engine did not return one


def _perf(pb: Any, metrics: list[PerfMetrics]) -> list[Any]:
    """NVIDIA's perf outputs: the KV-cache ones per sequence, the others of the first."""
    return [
        pb.Tensor(name, np.array([getattr(m, name) for m in metrics[: None if each else 1]], dtype))
        for name, dtype, each in _PERF_OUTPUTS
    ]
