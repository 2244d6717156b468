"""hf backend: a local transformers causal LM, on the CPU or, where one is present, a CUDA GPU
(the stand-in decoding on a GPU; TensorRT-LLM is not involved).

Every step is ONE forward over all active requests, as TensorRT-LLM's in-flight batching mixes
context and generation requests in one step, and the step's tokens are packed as TensorRT-LLM
packs them: the decoding requests' last tokens and the joining requests' whole prompts in one
row, with no padding. Only attention needs to know whose token is whose: the model runs with this
module's attention function (:func:`_attention`), which writes each token's keys and values into
its request's row of a slot cache (:class:`_SlotCache`, position p in column p) and attends per
request. Padding the step instead (every decoding row as wide as the longest joining prompt) made
each step with a joiner cost the prompt width for every row, so a load whose requests arrive
spread out, as through a serving layer, ran slower than one whose requests start together.
Torch and transformers are imported here only, so the synthetic mode never pays for them.
"""

from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...common.media import MediaError, decode_image
from ..stub_settings import media_limits
from .block_cache import BlockTable
from .mrope import MRope, step_positions
from .request import GenRequest
from .sampling import select_token
from .scheduler import StepResult

# The attention implementation the stand-in's model runs with; without a step layout (e.g.
# transformers' own generate()) it is SDPA.
ATTENTION = "trtllm_packed_step"


@dataclass(slots=True)
class _SeqState:
    generator: torch.Generator
    length: int = 0  # tokens in its cache (its reused prefix, before its prompt's forward)
    slot: int = -1  # its row of the slot cache, while it is in the batch
    matcher: object = None  # xgrammar.GrammarMatcher of a guided request
    fed: bool = False  # its prompt went through a forward
    reused: torch.Tensor | None = None  # block ids of its reused prefix, copied in at its join
    # A request with images: the embeddings of its image tokens, in prompt order, until its join.
    image_embeds: torch.Tensor | None = None
    # A request with images to an M-RoPE model (mrope.py): its prompt's [3, tokens] positions
    # until its join, and its rope delta, which its generated tokens' positions add.
    rope: torch.Tensor | None = None
    rope_delta: int = 0


@dataclass(slots=True)
class _StepLayout:
    """Where one forward's packed tokens belong. The first `decoding` tokens are the decoding
    requests' (one each), then the joining requests' prompts, one after the other. Tensors are
    on the model's device; the masks are made once per step, not per layer."""

    cache: _SlotCache
    input_ids: torch.Tensor  # [tokens]
    last: torch.Tensor  # [requests] packed index of each request's last token
    slots: torch.Tensor  # [tokens] each token's row of the slot cache
    columns: torch.Tensor  # [tokens] and its column there: its position in its sequence
    decoding: int
    decode_slots: torch.Tensor  # [decoding]
    decode_lengths: torch.Tensor  # [slots] tokens in each row after this step; 0: not decoding
    decode_mask: torch.Tensor  # [slots, 1, 1, width] the columns each row's query sees
    join_slots: torch.Tensor  # [joiners]
    join_mask: torch.Tensor  # [joiners, 1, span, span] causal, within each prompt
    join_gather: torch.Tensor  # [joiners * span] packed index of (joiner, query); padding: 0
    join_valid: torch.Tensor  # [prompt tokens] the (joiner, query) entries that hold a token
    join_query_columns: torch.Tensor  # [joiners, span] each query's column
    # (slot, block ids) of each joiner's reused prefix, copied from the block store per layer.
    restores: list[tuple[int, torch.Tensor]]
    blocks: _BlockStore | None

    @classmethod
    def pack(
        cls,
        cache: _SlotCache,
        decoding: list[GenRequest],
        joining: list[GenRequest],
        device: torch.device,
        blocks: _BlockStore | None = None,
    ) -> _StepLayout:
        """The layout of a step: `decoding` feed their last token, `joining` their prompt (every
        request already seated in `cache`)."""
        ids: list[int] = []
        slots: list[int] = []
        columns: list[int] = []
        lengths_by_slot = [0] * len(cache.owners)
        for req in decoding:
            state: _SeqState = req.backend_state  # type: ignore[assignment]
            ids.append(req.generated[-1])
            slots.append(state.slot)
            columns.append(state.length)
            lengths_by_slot[state.slot] = state.length + 1
        last = list(range(len(decoding)))
        # A joiner feeds its prompt past its reused prefix (state.length tokens already cached):
        # its queries are columns reused..len-1, its keys columns 0..len-1.
        reused = [req.backend_state.length for req in joining]  # type: ignore[union-attr]
        span = max((len(req.prompt) - r for req, r in zip(joining, reused, strict=True)), default=0)
        key_span = max((len(req.prompt) for req in joining), default=0)
        gather: list[int] = []
        valid: list[int] = []
        for index, (req, skip) in enumerate(zip(joining, reused, strict=True)):
            state = req.backend_state  # type: ignore[assignment]
            start, length = len(ids), len(req.prompt) - skip
            ids.extend(req.prompt[skip:])
            slots.extend([state.slot] * length)
            columns.extend(range(skip, skip + length))
            gather.extend([start + c if c < length else 0 for c in range(span)])
            valid.extend(range(index * span, index * span + length))
            last.append(start + length - 1)
        width = max(lengths_by_slot, default=0)
        cache.reserve(max(width, key_span))
        # One copy to the device for all of the step's index lists.
        parts = [ids, slots, columns, last, lengths_by_slot, gather, valid,
                 [req.backend_state.slot for req in joining],  # type: ignore[union-attr]
                 [len(req.prompt) for req in joining], reused]  # fmt: skip
        flat = torch.tensor([v for part in parts for v in part], dtype=torch.long)
        (ids_t, slots_t, columns_t, last_t, lengths_t, gather_t, valid_t, join_t, prompts_t,
         reused_t) = flat.to(device).split([len(part) for part in parts])  # fmt: skip
        decode_columns = torch.arange(width, device=device)
        decode_mask = (decode_columns < lengths_t[:, None]) | (
            (lengths_t == 0)[:, None] & (decode_columns == 0)  # idle slots: a finite softmax
        )
        # [joiners, span (queries), key_span (keys)]: query q of joiner j is column reused_j + q;
        # it sees the keys up to itself within the prompt.
        query_columns = reused_t[:, None] + torch.arange(span, device=device)[None, :]
        key_columns = torch.arange(key_span, device=device)
        join_mask = (key_columns[None, None, :] <= query_columns[:, :, None]) & (
            key_columns[None, None, :] < prompts_t[:, None, None]
        )
        return cls(
            cache=cache,
            input_ids=ids_t,
            last=last_t,
            slots=slots_t,
            columns=columns_t,
            decoding=len(decoding),
            decode_slots=slots_t[: len(decoding)],
            decode_lengths=lengths_t,
            decode_mask=decode_mask[:, None, None, :],
            join_slots=join_t,
            join_mask=join_mask[:, None],
            join_gather=gather_t,
            join_valid=valid_t,
            join_query_columns=query_columns,
            restores=[
                (req.backend_state.slot, req.backend_state.reused)  # type: ignore[union-attr]
                for req in joining
                if req.backend_state.reused is not None  # type: ignore[union-attr]
            ],
            blocks=blocks,
        )


class _BlockStore:
    """The prefix cache's keys and values: per layer, [blocks, kv_heads, block_size, dim]
    tensors (made with the first block stored, like the slot cache's), indexed by the block
    table's ids."""

    def __init__(self, table: BlockTable) -> None:
        self.table = table
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def store(self, cache: _SlotCache, slot: int, tokens: list[int], extra: bytes = b"") -> None:
        """Keep the full blocks of `tokens`, whose keys and values are in `slot`'s row (`extra`:
        the request's identity beyond its tokens, BlockTable.keep's)."""
        size = self.table.block_size
        new = self.table.keep(tokens, extra)
        if not new:
            return
        ids = torch.tensor([block_id for _, block_id in new], dtype=torch.long)
        columns = torch.cat([torch.arange(p * size, (p + 1) * size) for p, _ in new])
        for layer, (keys, values) in cache.layers.items():
            stored = self.layers.get(layer)
            if stored is None:
                rows, heads, _, dim = keys.shape
                shape = (self.table.max_blocks, heads, size, dim)
                stored = self.layers[layer] = (keys.new_zeros(shape), values.new_zeros(shape))
            ids_here, columns_here = ids.to(keys.device), columns.to(keys.device)
            for source, target in zip((keys, values), stored, strict=True):
                block = source[slot][:, columns_here]  # [heads, blocks * size, dim]
                heads, _, dim = block.shape
                target[ids_here] = block.view(heads, len(new), size, dim).transpose(0, 1)

    def restore(
        self,
        layer: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        restores: list[tuple[int, torch.Tensor]],
    ) -> None:
        """Copy each joiner's reused blocks into the first columns of its slot's row."""
        stored = self.layers[layer]
        for slot, ids in restores:
            for source, target in zip(stored, (keys, values), strict=True):
                blocks = source[ids]  # [blocks, heads, size, dim]
                count, heads, size, dim = blocks.shape
                target[slot, :, : count * size] = blocks.transpose(0, 1).reshape(
                    heads, count * size, dim
                )


class _SlotCache:
    """Keys and values per layer, one [rows, kv_heads, width, head_dim] tensor each: a request's
    tokens in its own row ("slot"), the token at position p in column p. No padding, no holes;
    a row's columns past its length are ignored, so a freed slot is reused as it is."""

    def __init__(self) -> None:
        self.owners: list[GenRequest | None] = []  # the request in each slot
        self.width = 0  # columns every layer's tensors have (grown on demand)
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def seat(self, active: list[GenRequest]) -> None:
        """Free the slots of requests that left; give each new request a free slot."""
        present = {id(req) for req in active}
        for index, owner in enumerate(self.owners):
            if owner is not None and id(owner) not in present:
                self.owners[index] = None
        while self.owners and self.owners[-1] is None:  # decode attention spans every slot
            self.owners.pop()
        for req in active:
            state: _SeqState = req.backend_state  # type: ignore[assignment]
            if state.slot >= 0:
                continue
            free = next((i for i, owner in enumerate(self.owners) if owner is None), None)
            if free is None:
                free = len(self.owners)
                self.owners.append(None)
            self.owners[free], state.slot = req, free

    def reserve(self, width: int) -> None:
        """Make room for `width` columns (the longest sequence after this step)."""
        if width > self.width:
            self.width = max(width, 2 * self.width, 64)

    def tensors(self, layer: int, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's cache, made or grown to the slots and width needed, like `keys`."""
        rows = len(self.owners)
        have = self.layers.get(layer)
        if have is not None and have[0].shape[0] >= rows and have[0].shape[2] >= self.width:
            return have
        _, heads, _, dim = keys.shape
        if have is not None and have[0].shape[0] < rows:
            rows = max(rows, 2 * have[0].shape[0])  # grow by doubling, not one slot at a time
        elif have is not None:
            rows = have[0].shape[0]
        shape = (rows, heads, self.width, dim)
        grown = (keys.new_zeros(shape), keys.new_zeros(shape))
        if have is not None:
            old_rows, _, old_width, _ = have[0].shape
            for new, old in zip(grown, have, strict=True):
                new[:old_rows, :, :old_width] = old
        self.layers[layer] = grown
        return grown


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    trtllm_step: _StepLayout | None = None,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over a packed step: query [1, heads, tokens, dim], key and value [1, kv_heads,
    tokens, dim] for this step's tokens only. Writes them into the slot cache, then attends per
    request: the decoding tokens each to their own row, the prompts causally to themselves.
    Returns [1, tokens, heads, dim]."""
    kv_cache = getattr(module, "trtllm_kv_cache", None)
    if kv_cache is not None:  # a quantized KV cache: keys and values as it stores them
        key, value = kv_cache(key, value)
    if trtllm_step is None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
        return sdpa(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    for unsupported in ("softcap", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"the hf engine cannot run attention with {unsupported}")
    window = kwargs.get("sliding_window")
    step = trtllm_step
    layer: int = module.layer_idx  # type: ignore[assignment]
    keys, values = step.cache.tensors(layer, key)
    if step.restores:
        assert step.blocks is not None
        step.blocks.restore(layer, keys, values, step.restores)
    # [tokens, kv_heads, dim] into (slot, column) of each token
    keys[step.slots, :, step.columns] = key[0].transpose(0, 1)
    values[step.slots, :, step.columns] = value[0].transpose(0, 1)
    heads, dim = query.shape[1], query.shape[3]
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    tokens = query[0].transpose(0, 1)  # [tokens, heads, dim]
    out = []
    if step.decoding:
        # Every slot's row of the cache as it lies, each with one query (a zero one where the
        # slot does not decode), its heads grouped by their key-value head: no cache copied.
        rows, _, _, width = step.decode_mask.shape
        mask = step.decode_mask
        if window:
            columns = torch.arange(width, device=query.device)
            mask = mask & (columns > step.decode_lengths[:, None] - 1 - window)[:, None, None]
        q = query.new_zeros((rows, heads, dim)).index_copy_(
            0, step.decode_slots, tokens[: step.decoding]
        )
        attended = torch.nn.functional.scaled_dot_product_attention(
            q.view(rows, kv_heads, groups, dim),
            keys[:rows, :, :width],
            values[:rows, :, :width],
            attn_mask=mask,
            scale=scaling,
        )
        out.append(attended.reshape(rows, heads, dim).index_select(0, step.decode_slots))
    if step.join_slots.shape[0]:
        joiners, _, span, key_span = step.join_mask.shape
        mask = step.join_mask
        if window:
            columns = torch.arange(key_span, device=query.device)
            queries = step.join_query_columns[:, None, :, None]
            mask = mask & (columns > queries - window)
        q = tokens.index_select(0, step.join_gather).view(joiners, span, heads, dim)
        k = keys[:, :, :key_span].index_select(0, step.join_slots)
        v = values[:, :, :key_span].index_select(0, step.join_slots)
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        attended = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k, v, attn_mask=mask, scale=scaling
        )  # [joiners, heads, span, dim]
        flat = attended.transpose(1, 2).reshape(joiners * span, heads, dim)
        out.append(flat.index_select(0, step.join_valid))
    return torch.cat(out)[None] if len(out) > 1 else out[0][None], None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, _attention)
    # generate() without a layout builds the masks SDPA takes.
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


class _GuideStep:
    """Grammar masks for the guided rows of a batch: one bitmask fill, one mask application and
    one accept call per step for all of them (per-row calls cost more than the masking itself)."""

    def __init__(self, vocab_size: int) -> None:
        import xgrammar

        self._xgrammar = xgrammar
        self._vocab_size = vocab_size
        # One thread: the engine shares the machine's cores with Triton and the service.
        self._batch = xgrammar.BatchGrammarMatcher(max_threads=1)
        self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)

    def matcher(self, req: GenRequest) -> object:
        # The request's end token closes the guide (the tokenizer's when it sent none).
        stop = [req.end_id] if req.end_id is not None and req.end_id >= 0 else None
        return self._xgrammar.GrammarMatcher(req.grammar, override_stop_tokens=stop)

    def mask(self, matchers: list[object], logits: torch.Tensor) -> None:
        """Set the logits [rows, vocab] of every token the grammars forbid next to -inf."""
        rows = len(matchers)
        if self._bitmask.shape[0] < rows:
            self._bitmask = self._xgrammar.allocate_token_bitmask(rows, self._vocab_size)
        bitmask = self._bitmask[:rows]
        self._batch.batch_fill_next_token_bitmask(matchers, bitmask)
        if logits.device != bitmask.device:  # matchers fill a host mask; a GPU masks on the GPU
            bitmask = bitmask.to(logits.device, non_blocking=True)
        self._xgrammar.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self._vocab_size)

    def accept(self, reqs: list[GenRequest], matchers: list[object], tokens: list[int]) -> None:
        accepted = self._xgrammar.BatchGrammarMatcher.batch_accept_token(matchers, tokens)
        for req, matcher, token, ok in zip(reqs, matchers, tokens, accepted, strict=True):
            if not ok:
                raise RuntimeError(f"the grammar rejected token {token} it allowed")
            if matcher.is_terminated():  # type: ignore[attr-defined]
                req.guide_ended = True


def _context_rows(
    decoding: list[GenRequest], joining: list[GenRequest]
) -> list[tuple[GenRequest, torch.Tensor]]:
    """The joining requests that asked for their prompt's logits, each with the packed index
    of every prompt token (the decoding requests' tokens come first, then each prompt)."""
    rows = []
    start = len(decoding)
    for req in joining:
        if req.context_logits:  # reuses no prefix: every position goes through the forward
            rows.append((req, torch.arange(start, start + len(req.prompt))))
        start += len(req.prompt) - req.backend_state.length  # type: ignore[union-attr]
    return rows


def resolve_device(device: str = "auto") -> str:
    """ "auto": CUDA when torch sees a GPU, else the CPU; "cuda" without a GPU is an error."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device {device!r}: choose auto, cpu or cuda")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda: torch sees no CUDA GPU here (use auto or cpu)")
    return device


def _load_model(auto: Any, checkpoint_dir: str | Path, dtype: torch.dtype) -> Any:
    """The checkpoint's transformers model (`auto`: its Auto class); a ModelOpt-quantized one
    with its weights dequantized and its inputs quantized as ModelOpt's model does
    (dequantize.py), which transformers alone would read as plain floats."""
    from .dequantize import checkpoint_quantization, load_dequantized

    quantization = checkpoint_quantization(checkpoint_dir)
    if quantization is not None:
        return load_dequantized(auto, checkpoint_dir, quantization, dtype)
    return auto.from_pretrained(str(checkpoint_dir), local_files_only=True, dtype=dtype)


def default_num_threads() -> int:
    """Half the cores: the other half serves Triton, the stubs and the BentoML process."""
    return max(1, (os.cpu_count() or 2) // 2)


class HFBackend:
    """Scheduler backend running a transformers model; delays come from real compute."""

    ttft_s = 0.0
    itl_s = 0.0

    def __init__(
        self,
        checkpoint_dir: str | Path,
        *,
        num_threads: int | None = None,
        device: str = "auto",
        reuse: BlockTable | None = None,
    ) -> None:
        """`reuse`: the prefix cache's block table (TensorRT-LLM's enable_kv_cache_reuse); its
        blocks' keys and values are kept here. None: every prompt is computed in full."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        torch.set_num_threads(num_threads or default_num_threads())
        self.device = torch.device(resolve_device(device))
        # bf16 on the GPU (its matrix units' format); float32 on the CPU, where bf16 is slow.
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        config = json.loads((Path(checkpoint_dir) / "config.json").read_text())
        self.takes_images = "vision_config" in config  # an image-text-to-text model
        auto = AutoModelForImageTextToText if self.takes_images else AutoModelForCausalLM
        self.model = _load_model(auto, checkpoint_dir, dtype).to(self.device)
        self.model.eval()
        _register_attention()
        self.model.set_attn_implementation(ATTENTION)
        if self.model.config._attn_implementation != ATTENTION:
            # Its attention would ignore the step's layout and see no cache at all.
            raise ValueError(
                f"{type(self.model).__name__} does not take a custom attention function "
                "(transformers' AttentionInterface), which the hf engine runs its steps with"
            )
        text = getattr(self.model.config, "text_config", None) or self.model.config
        self.vocab_size = int(text.vocab_size)
        self.max_positions = int(getattr(text, "max_position_embeddings", 0) or 0)
        self._images = _ImageEncoder(checkpoint_dir, self.model) if self.takes_images else None
        self._guides: _GuideStep | None = None  # made with the first guided request
        self._cache = _SlotCache()
        self._blocks = _BlockStore(reuse) if reuse is not None else None

    # -- Backend protocol ---------------------------------------------------------------------
    def admit(self, req: GenRequest) -> None:
        for token in req.prompt:
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"token id {token} outside the vocabulary [0, {self.vocab_size})")
        if not req.prompt:
            raise ValueError("empty prompt")
        if self.max_positions and len(req.prompt) + req.max_new_tokens > self.max_positions:
            raise ValueError(
                f"prompt + output length {len(req.prompt) + req.max_new_tokens} exceeds the "
                f"model's max_position_embeddings {self.max_positions}"
            )
        generator = torch.Generator().manual_seed(int(req.sampling.seed) & 0xFFFF_FFFF_FFFF_FFFF)
        matcher = None
        if req.grammar is not None:
            if self._guides is None:
                self._guides = _GuideStep(self.vocab_size)
            matcher = self._guides.matcher(req)
        state = req.backend_state = _SeqState(generator=generator, matcher=matcher)
        if req.images:
            assert self._images is not None  # the scheduler admits images to takes_images only
            state.image_embeds, grid = self._images.embeds(req)
            if self._images.mrope is not None:  # from the whole prompt, a reused prefix or not
                assert grid is not None
                state.rope, state.rope_delta = self._images.mrope.prompt(req.prompt, grid)

    @torch.inference_mode()
    def release(self, req: GenRequest) -> None:
        """With reuse, the request's full blocks go to the prefix cache (its keys and values are
        still in its slot: the next step's seating frees the slot of every request that is no
        longer active, :meth:`_SlotCache.seat`)."""
        state: _SeqState | None = req.backend_state  # type: ignore[assignment]
        if self._blocks is not None and state is not None and state.fed and state.slot >= 0:
            # Keys and values exist for every token fed: the prompt and all but the last token.
            tokens = (req.prompt + req.generated)[: state.length]
            self._blocks.store(self._cache, state.slot, tokens, req.cache_key())

    @torch.inference_mode()
    def step(self, batch: list[GenRequest]) -> list[StepResult]:
        joining = [req for req in batch if not req.backend_state.fed]  # type: ignore[union-attr]
        if self._blocks is not None:
            for req in joining:
                if not req.context_logits:  # those need every position's logits
                    self._reuse(req)
        logits = self._forward(batch, joining)
        rows = [logits[id(req)] for req in batch]
        guided = [i for i, req in enumerate(batch) if req.backend_state.matcher is not None]  # type: ignore[union-attr]
        matchers = [batch[i].backend_state.matcher for i in guided]  # type: ignore[union-attr]
        if guided:
            assert self._guides is not None
            masked = torch.stack([rows[i] for i in guided]).to(torch.float32)
            self._guides.mask(matchers, masked)
            for i, row in zip(guided, masked, strict=True):
                rows[i] = row
        results = [
            select_token(row, req, req.backend_state.generator)  # type: ignore[union-attr]
            for req, row in zip(batch, rows, strict=True)
        ]
        if guided:
            assert self._guides is not None
            tokens = [results[i][0] for i in guided]
            self._guides.accept([batch[i] for i in guided], matchers, tokens)
        return results

    def _reuse(self, req: GenRequest) -> None:
        """Start the request past the longest prefix the cache holds (at least its last prompt
        token is computed: its logits give the first token)."""
        assert self._blocks is not None
        state: _SeqState = req.backend_state  # type: ignore[assignment]
        found = self._blocks.table.reusable(req.prompt, req.cache_key())
        if found:
            state.reused = torch.tensor(found, dtype=torch.long, device=self.device)
            state.length = len(found) * self._blocks.table.block_size
            req.reused_blocks, req.cached_tokens = len(found), state.length

    # -- the model call ------------------------------------------------------------------------
    def _forward(
        self, active: list[GenRequest], joining: list[GenRequest]
    ) -> dict[int, torch.Tensor]:
        """One forward of every active request, packed: the decoding requests' last tokens, then
        the joining requests' prompts. The last position's logits of each request, by
        id(request), on the CPU."""
        cache = self._cache
        cache.seat(active)
        joined = {id(req) for req in joining}
        decoding = [req for req in active if id(req) not in joined]
        step = _StepLayout.pack(cache, decoding, joining, self.device, self._blocks)
        keep, context = step.last, _context_rows(decoding, joining)
        if context:  # every prompt position of those requests, after each request's last one
            keep = torch.cat([keep, *(rows.to(self.device) for _, rows in context)])
        inputs: dict[str, torch.Tensor] = {"input_ids": step.input_ids[None]}
        if any(req.backend_state.image_embeds is not None for req in joining):  # type: ignore[union-attr]
            inputs = {"inputs_embeds": self._embeds(step.input_ids, decoding, joining)[None]}
        positions = step.columns[None]  # rotary positions; the cache's columns stay the columns
        if self._images is not None and self._images.mrope is not None:
            positions = step_positions(step.columns, decoding, joining)
        out = self.model(
            **inputs,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=keep,
            trtllm_step=step,
        )
        for req in decoding:
            req.backend_state.length += 1  # type: ignore[union-attr]
        for req in joining:
            state: _SeqState = req.backend_state  # type: ignore[assignment]
            state.length, state.fed, state.reused = len(req.prompt), True, None
            state.image_embeds = state.rope = None
        # Sampling runs on the CPU with each request's own seeded generator.
        logits = out.logits[0].float().cpu()  # one copy for the batch, not one per row
        order = decoding + joining
        row = len(order)
        for req, rows in context:  # the prompt's logits, its last position sampled from too
            req.prompt_logits = logits[row : row + len(rows)].numpy()
            row += len(rows)
        return {id(req): logits[row] for row, req in enumerate(order)}

    def _embeds(
        self, ids: torch.Tensor, decoding: list[GenRequest], joining: list[GenRequest]
    ) -> torch.Tensor:
        """The step's input embeddings: its tokens', with each joining prompt's image tokens
        (past its reused prefix) replaced by its images' embeddings."""
        assert self._images is not None
        embeds = self.model.get_input_embeddings()(ids)
        start = len(decoding)
        for req in joining:
            state: _SeqState = req.backend_state  # type: ignore[assignment]
            fed = req.prompt[state.length :]
            if state.image_embeds is not None:
                token = self._images.token_id
                # The image tokens of the reused prefix are cached; the rest are fed now.
                before = sum(1 for t in req.prompt[: state.length] if t == token)
                rows = [start + i for i, t in enumerate(fed) if t == token]
                if rows:
                    where = torch.tensor(rows, device=embeds.device)
                    features = state.image_embeds[before : before + len(rows)]
                    embeds[where] = features.to(embeds.dtype)
            start += len(fed)
        return embeds


class _ImageEncoder:
    """A vision-language model's image side: its image processor and vision tower, turning a
    request's images into the embeddings of its prompt's image tokens; and, for a model with
    multimodal rotary positions (Qwen2-VL's family), its M-RoPE."""

    def __init__(self, checkpoint_dir: str | Path, model: Any) -> None:
        from transformers import AutoImageProcessor

        self.processor = AutoImageProcessor.from_pretrained(
            str(checkpoint_dir), local_files_only=True
        )
        self.model = model
        config = model.config
        token = getattr(config, "image_token_id", None)
        if token is None:
            token = getattr(config, "image_token_index", None)
        if token is None:
            raise ValueError(f"{type(model).__name__}'s config names no image token id")
        self.token_id = int(token)
        self.limits = media_limits()
        self.mrope = MRope.of(model, self.token_id)
        # What the vision tower takes beside the pixels, of what the image processor returns
        # (Qwen2-VL's image_grid_thw: each image's patch grid).
        self._feature_inputs = set(inspect.signature(model.get_image_features).parameters) - {
            "pixel_values"
        }

    @torch.inference_mode()
    def embeds(self, req: GenRequest) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[image tokens, hidden]: the request's images through the vision tower and projector,
        as many rows as its prompt has image tokens (a ValueError when they differ); and their
        image_grid_thw, where the image processor gives one (Qwen2-VL's family)."""
        try:
            images = [decode_image(data, self.limits) for data in req.images]
        except MediaError as error:
            raise ValueError(str(error)) from None
        processed = self.processor(images, return_tensors="pt")
        parameter = next(self.model.parameters())
        extra = {
            name: value.to(parameter.device)
            for name, value in processed.items()
            if name in self._feature_inputs and isinstance(value, torch.Tensor)
        }
        features = self.model.get_image_features(
            pixel_values=processed["pixel_values"].to(parameter.device, parameter.dtype), **extra
        )
        if not isinstance(features, torch.Tensor):  # per image, in some models' versions
            features = getattr(features, "pooler_output", features)
            features = torch.cat([f.reshape(-1, f.shape[-1]) for f in features])
        features = features.reshape(-1, features.shape[-1])
        count = sum(1 for token in req.prompt if token == self.token_id)
        if count != features.shape[0]:
            raise ValueError(
                f"the prompt holds {count} image tokens but its {len(images)} images make "
                f"{features.shape[0]}: expand each image's placeholder with the model's processor"
            )
        return features, processed.get("image_grid_thw")
