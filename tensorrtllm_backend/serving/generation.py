"""The one request path every API shares: validate → Triton stream → text chunks.

Every API calls :meth:`Generator.admit` (which prepares the request, off the event loop when it
is large, and compiles its guide) and reads :meth:`Generator.stream`: the native `/generate` as
it is, every other API through the chat core's answer steps (:mod:`.chat.stream`), whose
collection is every whole answer.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common.engine_api import (
    DRAIN_RESPONSES,
    EngineModelError,
    EngineRequestError,
    EngineResult,
    InferenceEngine,
)
from ..common.engine_config import EngineInfo
from ..common.guides import GuideCompiler, GuideError, check_guide_present
from ..common.lora import LoraAdapter, LoraRegistry
from ..common.media import LoadedImage
from ..common.tokenization import StopStringMatcher
from .ids import new_request_id
from .metrics import GenerationMetrics
from .offload import Offloader
from .prompt_ids import MAX_CHARS_PER_TOKEN, encode_prompt
from .request_errors import RequestError
from .schemas import (
    LOG_PROB_FLOOR,
    GenerationChunk,
    SamplingParams,
    TopLogProbs,
)
from .sequence_state import SequenceState
from .token_strings import TokenStrings
from .translation import (
    LoraTensors,
    PromptLogProbs,
    response_prompt_log_probs,
    sequence_index,
)
from .triton_paths import PROMPT_NEXT_OUTPUTS, PROMPT_OUTPUTS, EngineRoute, Route, make_route


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_input_len: int
    max_seq_len: int
    max_beam_width: int = 1
    max_batch_size: int = 1
    # A TensorRT-LLM engine's KV-cache block size (its reused blocks count cached prompt tokens).
    tokens_per_block: int | None = None
    vocab_size: int | None = None  # the model's, where the engine says (its logits' width)

    @classmethod
    def from_engine(cls, info: EngineInfo) -> EngineLimits:
        # The C++ backend's and the CPU engine's reused blocks x this = cached prompt tokens.
        per_block = info.tokens_per_block
        return cls(
            info.max_input_len, info.max_seq_len, info.max_beam_width, info.max_batch_size,
            per_block, info.vocab_size,
        )  # fmt: skip


@dataclass(slots=True)
class PreparedRequest:
    request_id: str
    prompt: str
    params: SamplingParams
    prompt_ids: list[int]
    api: str = "native"  # metrics label
    lora: LoraAdapter | None = None
    images: tuple[LoadedImage, ...] = ()  # placed in the prompt (prompt_ids) by the processor
    # With images: the prompt with each image's placeholder once (the LLM API expands them).
    written_ids: list[int] | None = None


class Generator:
    """Validates requests against the engine and streams them through Triton."""

    def __init__(
        self,
        client: InferenceEngine,
        tokenizer: Any,
        limits: EngineLimits,
        route: Route = Route.DIRECT,
        metrics: GenerationMetrics | None = None,
        loras: LoraRegistry | None = None,
        lora_supported: bool = False,
        guides: GuideCompiler | None = None,
        guides_unsupported: str | None = None,
        top_log_probs_unsupported: str | None = None,
        offloader: Offloader | None = None,
        prompt_scores_unsupported: str | None = None,
    ) -> None:
        """`client`: the inference server requests stream through; `route`: the way through
        it (:mod:`.triton_paths`), which builds each request's tensors and decodes its responses.
        `guides` compiles guided_decoding guides against the served tokenizer (one is made
        from `tokenizer` when not given); `guides_unsupported` says why this model cannot
        enforce any guide (guided requests are then refused); `top_log_probs_unsupported` why
        its engine returns no alternatives to the chosen tokens; `prompt_scores_unsupported` why it
        cannot score prompts (:meth:`score`). `offloader` runs the work that grows with a request
        off the event loop (:mod:`.offload`)."""
        self.client = client
        self.offloader = offloader or Offloader()
        self.guides = guides or GuideCompiler(tokenizer)
        self.guides_unsupported = guides_unsupported
        self.top_log_probs_unsupported = top_log_probs_unsupported
        self.prompt_scores_unsupported = prompt_scores_unsupported
        self.metrics = metrics
        self.loras = loras or LoraRegistry()
        self.lora_supported = lora_supported
        self.tokenizer = tokenizer
        self.token_strings = TokenStrings(tokenizer)
        self.limits = limits
        self.route = route
        self.path: EngineRoute = make_route(route, tokenizer)
        self.path.tokens_per_block = limits.tokens_per_block
        self.path.vocab_size = limits.vocab_size
        self.model_name = self.path.model_name

    def prepare(
        self,
        prompt: str,
        params: SamplingParams,
        request_id: str | None = None,
        *,
        add_special_tokens: bool = True,
        max_tokens_cap: int | None = None,
        api: str = "native",
        lora: str | None = None,
        token_ids: list[int] | None = None,
        images: Sequence[LoadedImage] = (),
        written_ids: list[int] | None = None,
    ) -> PreparedRequest:
        """Tokenize and check every engine limit before Triton sees the request (blocking, in
        proportion to the prompt: the service calls it through :meth:`admit`).

        With `max_tokens_cap`, a request that did not set max_tokens gets all the room the engine
        leaves after the prompt, up to the cap (OpenAI chat semantics). With `token_ids`, the
        prompt is those tokens (checked against the vocabulary) and `prompt` is ignored: the
        prepared prompt is their text. `images` go with the prompt, whose token ids hold their
        placeholders (the chat core's processor put them there), and `written_ids` the same prompt
        with each placeholder once.
        """
        limits = self.limits
        if images and self.path.no_images is not None:
            raise RequestError(self.path.no_images, param="messages")
        self.path.check(params, lora)
        if params.top_log_probs:
            self._check_top_log_probs()
        adapter = self._adapter(lora)
        if params.beam_width > limits.max_beam_width:
            raise RequestError(
                f"beam_width {params.beam_width} exceeds this engine's max_beam_width "
                f"{limits.max_beam_width} (set at trtllm-build time)",
                param="beam_width",
            )
        sequences = params.num_return_sequences
        if sequences > 1 and params.beam_width > 1:
            raise RequestError(
                "num_return_sequences > 1 needs beam_width 1 (each sequence is sampled on its own)",
                param="num_return_sequences",
            )
        if sequences > 1 and self.path.single_sequence is not None:
            raise RequestError(self.path.single_sequence, param="num_return_sequences")
        if sequences > limits.max_batch_size:
            raise RequestError(
                f"num_return_sequences {sequences} exceeds this engine's max_batch_size "
                f"{limits.max_batch_size}: each sequence takes a batch slot",
                param="num_return_sequences",
            )
        if params.guided_decoding is not None:
            self._check_guide_text(params)
        if token_ids is not None:
            if self.path.no_token_prompts is not None:
                raise RequestError(self.path.no_token_prompts, param="prompt")
            prompt_ids = self._check_token_ids(token_ids)
            # Their text as a text prompt's echo shows it: special tokens (a BOS) left out.
            prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=True)
        else:
            prompt_ids = self._encode(prompt, add_special_tokens)
        room = limits.max_seq_len - len(prompt_ids)
        if max_tokens_cap is not None and "max_tokens" not in params.model_fields_set:
            params = params.model_copy(update={"max_tokens": max(1, min(room, max_tokens_cap))})
        if params.max_tokens > room:
            raise RequestError(
                f"max_tokens {params.max_tokens} plus the prompt's {len(prompt_ids)} tokens exceeds "
                f"this engine's max_seq_len {limits.max_seq_len}: ask for at most {room} tokens",
                param="max_tokens",
            )
        if params.min_tokens is not None and params.min_tokens > params.max_tokens:
            raise RequestError(
                f"min_tokens {params.min_tokens} is larger than max_tokens {params.max_tokens}",
                param="min_tokens",
            )
        if params.temperature and params.top_k is None and params.top_p is None:
            # TensorRT-LLM samples only with top_k or top_p set (both unset means greedy): a
            # request that asks for a temperature means to sample from the whole distribution.
            params = params.model_copy(update={"top_p": 1.0})
        self.path.check_prepared(params)
        return PreparedRequest(
            request_id or new_request_id(), prompt, params, prompt_ids, api, adapter,
            tuple(images), written_ids,
        )  # fmt: skip

    def _encode(self, prompt: str, add_special_tokens: bool) -> list[int]:
        limits = self.limits
        max_chars = limits.max_input_len * MAX_CHARS_PER_TOKEN
        if len(prompt) > max_chars:
            raise RequestError(
                f"prompt is {len(prompt)} characters, more than this engine's max_input_len of "
                f"{limits.max_input_len} tokens can hold (at most {max_chars} characters are "
                "read): shorten the prompt",
                param="prompt",
            )
        prompt_ids = encode_prompt(self.tokenizer, prompt, add_special_tokens, limits.max_input_len)
        if isinstance(prompt_ids, int):
            raise self._too_long(prompt_ids)
        if not prompt_ids:
            raise RequestError("prompt encodes to no tokens: send some text", param="prompt")
        return self._one_bos(prompt, prompt_ids) if add_special_tokens else prompt_ids

    def _one_bos(self, prompt: str, prompt_ids: list[int]) -> list[int]:
        """A text that starts with the BOS token's own text gets no second BOS from the
        tokenizer: an evaluation harness that sends its tokens decoded back to text (BOS
        included) is scored on exactly its tokens."""
        bos = self.tokenizer.bos_token_id
        text = self.tokenizer.bos_token
        if bos is not None and text and prompt.startswith(text) and prompt_ids[:2] == [bos, bos]:
            return prompt_ids[1:]
        return prompt_ids

    def _check_token_ids(self, token_ids: list[int]) -> list[int]:
        """A prompt sent as token ids: not empty, within max_input_len and the vocabulary."""
        if not token_ids:
            raise RequestError(
                "prompt holds no token ids: send at least one", param="prompt", code="invalid_value"
            )
        if len(token_ids) > self.limits.max_input_len:
            raise self._too_long(len(token_ids))
        size = len(self.tokenizer)
        outside = next((token for token in token_ids if not 0 <= token < size), None)
        if outside is not None:
            raise RequestError(
                f"prompt holds token id {outside}, outside the vocabulary [0, {size})",
                param="prompt",
                code="invalid_value",
            )
        return list(token_ids)

    def _too_long(self, tokens: int) -> RequestError:
        return RequestError(
            f"prompt is {tokens} tokens but this engine accepts at most "
            f"{self.limits.max_input_len} (max_input_len): shorten the prompt",
            param="prompt",
        )

    @property
    def top_log_probs_missing(self) -> str | None:
        """Why the generation returns no alternatives to the chosen tokens (None: it does): the
        route passes none through, or the engine returns none. Prompt scores have theirs all
        the same (:meth:`score`)."""
        return self.path.no_top_log_probs or self.top_log_probs_unsupported

    def _check_top_log_probs(self) -> None:
        """Alternatives to the chosen tokens come only from an engine and route that return
        them; a request for them elsewhere is refused, never answered with fewer."""
        reason = self.top_log_probs_missing
        if reason is not None:
            raise RequestError(reason, param="top_log_probs")

    async def admit(
        self,
        prompt: str,
        params: SamplingParams,
        request_id: str | None = None,
        *,
        size: int | None = None,
        **options: Any,
    ) -> PreparedRequest:
        """:meth:`prepare` (`options` are its keywords), in the offloader's threads when the
        request is large (`size`: its size in characters or bytes, the prompt's length if not
        given), then :meth:`check_guide`. What every API calls before :meth:`stream`."""
        if size is None:
            guide = params.guided_decoding.guide if params.guided_decoding else None
            size = len(prompt) + len(guide or "")
        prepared = await self.offloader.run(
            size, self.prepare, prompt, params, request_id, **options
        )
        await self.check_guide(prepared)
        return prepared

    def _check_guide_text(self, params: SamplingParams) -> None:
        """The guide checks that cost nothing; the rest run with the compiler (check_guide)."""
        if self.guides_unsupported is not None:
            raise RequestError(self.guides_unsupported, param="guided_decoding")
        guided = params.guided_decoding
        assert guided is not None
        try:
            check_guide_present(guided)
        except GuideError as error:
            raise RequestError(str(error), param=error.param) from None

    async def check_guide(self, request: PreparedRequest) -> None:
        """Check and compile the request's guide in the compiler's threads (cached, bounded in
        time: see GuideCompiler) so that one the engine could not enforce is a 400 quoting the
        compiler, before Triton sees the request. :meth:`admit` calls it; :meth:`stream` too (a
        cache hit once checked)."""
        guided = request.params.guided_decoding
        if guided is None:
            return
        try:
            await self.guides.check(guided)
        except GuideError as error:
            raise RequestError(str(error), param=error.param) from None

    def _adapter(self, name: str | None) -> LoraAdapter | None:
        if name is None:
            return None
        adapter = self.loras.get(name)
        if adapter is None:
            known = ", ".join(self.loras.names()) or "none"
            raise RequestError(
                f"unknown LoRA adapter {name!r}; this model has: {known}", 404, param="lora"
            )
        if not self.lora_supported:
            raise RequestError(
                "LoRA adapters need TensorRT-LLM (an engine built with the LoRA plugin, or the "
                "LLM API); this model's engine does not apply them",
                param="lora",
            )
        return adapter

    def check_scoring(self, request: PreparedRequest, k: int, first_token: bool = False) -> None:
        """Refuse a prompt-scoring request this model cannot serve (see :meth:`score`); with
        `first_token`, one whose first generated token's alternatives come from the scores too
        (:meth:`score_with_next`). The scores' `k` alternatives come from the scorer, whatever
        the generation returns: only what the scorer cannot do is refused here."""
        if self.prompt_scores_unsupported is not None:
            raise RequestError(self.prompt_scores_unsupported, param="echo")
        if request.lora is not None and self.path.sends_lora_weights:
            raise RequestError(
                "prompt log probs with a LoRA adapter are served by the LLM API workflow "
                "(pack_model.py --workflow llmapi), not by TensorRT-LLM engines",
                param="echo",
            )
        if request.images:
            raise RequestError(
                "prompt log probs are not served for prompts with images: the scorer reads the "
                "prompt's token ids alone; send the request without them",
                param="echo",
            )
        if first_token:
            self._check_first_token_scores(request.params)

    def _check_first_token_scores(self, params: SamplingParams) -> None:
        """The first generated token's alternatives from the prompt's scores are the model's
        own distribution after the prompt; an engine's are of the distribution its sampling
        parameters make of it. A request whose parameters would change it is refused, never
        answered with other numbers than the engine's."""
        neutral = (
            ("temperature", params.temperature, (None, 0.0, 1.0)),
            ("repetition_penalty", params.repetition_penalty, (None, 1.0)),
            ("presence_penalty", params.presence_penalty, (None, 0.0)),
            ("frequency_penalty", params.frequency_penalty, (None, 0.0)),
            ("min_tokens", params.min_tokens, (None, 0)),
        )
        changed = [name for name, value, plain in neutral if value not in plain]
        changed += ["bad_words"] if params.bad_words else []
        changed += ["a guide"] if params.guided_decoding is not None else []
        if changed:
            why = f"{self.top_log_probs_missing}; " if self.top_log_probs_missing else ""
            raise RequestError(
                f"{why}the generated token's alternatives come from the prompt's scores here "
                f"(the model's distribution after the prompt), which {', '.join(changed)} would "
                "change: leave them out (temperature 0 or 1)",
                param="top_log_probs",
            )

    async def score(self, request: PreparedRequest, k: int) -> PromptLogProbs:
        """The prompt's token log probs (the first token has none) and `k` alternatives at each
        position, computed by the engine from its context logits and reduced beside it: one
        engine request of its own, apart from the generation's."""
        scores, _ = await self._score(request, k, False)
        return scores

    async def score_with_next(
        self, request: PreparedRequest, k: int
    ) -> tuple[PromptLogProbs, TopLogProbs]:
        """:meth:`score`, and the `k` most likely tokens after the prompt with their log probs
        (the last row of the same context logits: the first generated token's alternatives,
        where the generation returns none; greedy decoding picks the first of them). Served by
        the engine workflow's scorer (`prompt_logprobs`), not by the llmapi model, whose
        generation returns alternatives itself."""
        scores, following = await self._score(request, k, True)
        assert following is not None
        return scores, following

    async def _score(
        self, request: PreparedRequest, k: int, next_token: bool
    ) -> tuple[PromptLogProbs, TopLogProbs | None]:
        model, tensors = self.path.score_inputs(request, k)
        outputs = [*PROMPT_OUTPUTS, *PROMPT_NEXT_OUTPUTS] if next_token else list(PROMPT_OUTPUTS)
        found = following = None
        try:
            async with aclosing(
                self.client.stream(model, tensors, outputs, f"{request.request_id}-score")
            ) as results:
                async for result in results:
                    scores = response_prompt_log_probs(
                        result, PROMPT_OUTPUTS, len(request.prompt_ids), k
                    )
                    found = scores or found
                    if next_token:
                        following = _next_token_alternatives(result, k) or following
        except EngineRequestError as error:
            if next_token and PROMPT_NEXT_OUTPUTS[0] in str(error):
                raise RequestError(
                    "this model's prompt_logprobs model returns no alternatives of the token "
                    "after the prompt (packed by an older version): repack the model",
                    param="top_log_probs",
                ) from None
            raise
        if found is None or (next_token and following is None):
            raise EngineModelError(f"{model} answered no prompt log probs")
        return found, following

    async def stream(self, request: PreparedRequest) -> AsyncIterator[GenerationChunk]:
        """Text chunks as they become final; each sequence's last chunk carries its finish
        reason (chunks of several sequences interleave, told apart by `index`).

        One loop does the per-token work (decode, stop strings, metrics): every extra async
        generator layer on this path costs CPU per token.
        """
        params = request.params
        await self.check_guide(request)
        tracker = (
            self.metrics.track(request.api, len(request.prompt_ids), request.request_id)
            if self.metrics
            else None
        )
        sequences = [self._sequence(index, params) for index in range(params.num_return_sequences)]
        several = len(sequences) > 1
        running = len(sequences)
        failure: BaseException | None = None
        results = self._results(request)
        results_open = True
        result: EngineResult | None = None
        try:
            if not params.exclude_input_in_output:
                for sequence in sequences:
                    yield GenerationChunk(text=request.prompt, index=sequence.index)
            async for result in results:
                sequence = sequences[sequence_index(result)] if several else sequences[0]
                if sequence.stopped:
                    continue  # cut at a stop string; the engine still runs its siblings
                text, token_ids, count, log_probs, top = sequence.decode(result)
                sequence.generated += count
                if tracker is not None:
                    tracker.tokens(count)
                stops = sequence.stops
                emit, stopped = stops.feed(text) if stops.active else (text, False)
                if emit or count:
                    yield GenerationChunk(
                        emit, token_ids, log_probs, top, token_count=count, index=sequence.index
                    )
                if stopped:
                    running -= 1
                    if not running:
                        # The engine got the stop words too and normally ends the stream itself
                        # within a response or two: let it, rather than race it with a cancel.
                        self.client.let_finish(results)
                        results_open = False
                        break
            results_open = False  # exhausted, or handed over
            # A request's last response tells how much of its prompt the engine's KV cache held.
            cached = self.path.cached_tokens(result) if result is not None else 0
            for sequence in sequences:
                chunk = sequence.last_chunk(params.max_tokens)
                chunk.cached_tokens = cached
                yield chunk
            if tracker is not None:
                tracker.finish = sequences[0].finish_reason.value
        except BaseException as error:
            failure = error
            raise
        finally:
            if results_open:
                await self._release(results, sequences, params.max_tokens)
            if tracker is not None:
                tracker.close(failure)

    async def _release(
        self,
        results: AsyncGenerator[EngineResult, None],
        sequences: list[SequenceState],
        max_tokens: int,
    ) -> None:
        """Stop a Triton stream the caller left early (disconnect, error): cancel it, unless it
        would end on its own within a few responses anyway (see InferenceEngine.let_finish)."""
        tokens_left = sum(max(0, max_tokens - sequence.generated) for sequence in sequences)
        # +1: a stream may end with an empty final response.
        if tokens_left + len(sequences) <= DRAIN_RESPONSES:
            self.client.let_finish(results)
        else:
            await results.aclose()

    def _sequence(self, index: int, params: SamplingParams) -> SequenceState:
        return SequenceState(index, self.path.decoder(params), StopStringMatcher(params.stop))

    def _results(self, request: PreparedRequest) -> AsyncGenerator[EngineResult, None]:
        """The Triton stream of a request (with the LoRA cache protocol when it names one)."""
        if request.lora is None:
            tensors, outputs = self._triton_inputs(request, False)
            return self.client.stream(self.model_name, tensors, outputs, request.request_id)
        return self._results_with_lora(request, request.lora)

    async def _results_with_lora(
        self, request: PreparedRequest, adapter: LoraAdapter
    ) -> AsyncGenerator[EngineResult, None]:
        """Weights go with an adapter's first request; one evicted from the backend's cache is
        sent again with its weights."""
        # The llmapi model reads an adapter from its path: no weights travel, no cache to refill.
        sends = self.path.sends_lora_weights
        send_weights = sends and self.loras.needs_weights(adapter)
        for attempt in range(2):
            # np.load of the adapter's weights (megabytes) runs off the loop.
            weights = (
                await self.offloader.run(adapter.nbytes, adapter.tensors) if send_weights else None
            )
            tensors, outputs = self._triton_inputs(request, send_weights, weights)
            received = False
            try:
                async with aclosing(
                    self.client.stream(self.model_name, tensors, outputs, request.request_id)
                ) as results:
                    async for result in results:
                        if not received:
                            self.loras.mark_sent(adapter)
                            received = True
                        yield result
                return
            except EngineModelError as error:
                evicted = "not found" in str(error).lower()
                if received or send_weights or not evicted or attempt or not sends:
                    raise
                self.loras.mark_sent(adapter, sent=False)
                send_weights = True

    def _triton_inputs(
        self,
        request: PreparedRequest,
        send_lora_weights: bool,
        lora_arrays: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[dict[str, np.ndarray], list[str]]:
        """The request's tensors; with the LoRA adapter's weights when `send_lora_weights`
        (`lora_arrays`, as loaded already, or loaded here)."""
        lora = None
        if request.lora is not None:
            adapter = request.lora
            if send_lora_weights and self.path.sends_lora_weights:
                weights, config = lora_arrays or adapter.tensors()
            else:
                weights = config = None
            lora = LoraTensors(adapter.task_id, weights, config, adapter.name, str(adapter.path))
        tensors, outputs = self.path.inputs(request, lora)
        return tensors, list(outputs)


def _next_token_alternatives(result: EngineResult, k: int) -> TopLogProbs | None:
    """The scorer's `k` most likely tokens after the prompt, if the response carries them."""
    ids = result.values(PROMPT_NEXT_OUTPUTS[0])
    if ids is None:
        return None
    values = result.values(PROMPT_NEXT_OUTPUTS[1]) or []
    if len(ids) != k or len(values) != k:
        raise EngineModelError(f"the engine returned no {k} alternatives of the first new token")
    return [int(i) for i in ids], [max(float(value), LOG_PROB_FLOOR) for value in values]
