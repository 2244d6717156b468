"""hf backend: a local transformers causal LM, on the CPU or, where one is present, a CUDA GPU
(the stand-in decoding on a GPU; TensorRT-LLM is not involved).

Every step is ONE forward over all active requests, as TensorRT-LLM's in-flight batching mixes
context and generation requests in one step: the requests that decode feed their last token, the
requests that join feed their whole prompt, each row left-padded to the widest input. The KV
cache is one [rows, heads, width, dim] tensor per layer (:class:`_DecodeBatch`) with a mask of the
columns that hold a row's tokens; joining leaves masked holes in the decoding rows, which a
compaction removes once they outgrow the tokens. A prefill forward beside the decode forward
made every step with a joiner cost two forwards, so a load whose requests arrive spread out (as
through a serving layer) ran slower than one whose requests start together. The batch changes
only where requests join or leave, with a few tensor operations per layer whatever its size.
Torch and transformers are imported here only, so the synthetic mode never pays for them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .request import GenRequest
from .sampling import select_token
from .scheduler import StepResult

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [rows, heads, width, dim]


@dataclass(slots=True)
class _SeqState:
    generator: torch.Generator
    length: int = 0  # tokens in its cache; 0 until its prompt went through a forward
    matcher: object = None  # xgrammar.GrammarMatcher of a guided request


class _DecodeBatch:
    """The KV caches of the active requests, one [rows, heads, width, dim] tensor per layer (keys
    and values), and `mask` [rows, width]: which columns hold a row's tokens, in order."""

    def __init__(self) -> None:
        self.reqs: list[GenRequest] = []
        self.layers: KV = []
        self.mask: torch.Tensor | None = None  # 1 where a column holds a token; on the device
        self.width = 0  # columns of the cache tensors

    def states(self) -> list[_SeqState]:
        return [r.backend_state for r in self.reqs]  # type: ignore[misc]

    def keep(self, reqs: list[GenRequest]) -> None:
        """Keep the rows of `reqs` (all in the batch), in the batch's order; drop the others."""
        wanted = {id(req) for req in reqs}
        kept = [row for row, req in enumerate(self.reqs) if id(req) in wanted]
        if len(kept) == len(self.reqs):
            return
        if not kept:
            self.clear()
            return
        assert self.mask is not None
        index = torch.tensor(kept, device=self.mask.device)
        self.layers = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.layers]
        self.mask = self.mask.index_select(0, index)
        self.reqs = [self.reqs[row] for row in kept]

    def compact(self) -> None:
        """Right-align every row's tokens and drop the columns no row needs (one gather per
        tensor), once holes and padding outnumber the longest row's tokens."""
        longest = max(state.length for state in self.states())
        if self.width - longest < max(longest, 32):
            return
        assert self.mask is not None
        # A stable sort of the mask puts each row's empty columns first, its tokens after, in order.
        order = torch.sort(self.mask, dim=1, stable=True).indices[:, -longest:]
        layers: KV = []
        for k, v in self.layers:
            index = order[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
            layers.append((k.gather(2, index), v.gather(2, index)))
        lengths = torch.tensor([s.length for s in self.states()], device=order.device)
        columns = torch.arange(longest, device=order.device)
        self.mask = (columns >= (longest - lengths)[:, None]).long()
        self.layers, self.width = layers, longest

    def clear(self) -> None:
        self.reqs, self.layers, self.mask, self.width = [], [], None, 0


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


def resolve_device(device: str = "auto") -> str:
    """ "auto": CUDA when torch sees a GPU, else the CPU; "cuda" without a GPU is an error."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device {device!r}: choose auto, cpu or cuda")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda: torch sees no CUDA GPU here (use auto or cpu)")
    return device


def default_num_threads() -> int:
    """Half the cores: the other half serves Triton, the stubs and the BentoML process."""
    return max(1, (os.cpu_count() or 2) // 2)


class HFBackend:
    """Scheduler backend running a transformers model; delays come from real compute."""

    ttft_s = 0.0
    itl_s = 0.0

    def __init__(
        self, checkpoint_dir: str | Path, *, num_threads: int | None = None, device: str = "auto"
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(num_threads or default_num_threads())
        self.device = torch.device(resolve_device(device))
        # bf16 on the GPU (its matrix units' format); float32 on the CPU, where bf16 is slow.
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(
            str(checkpoint_dir), local_files_only=True, dtype=dtype
        ).to(self.device)
        self.model.eval()
        self.vocab_size = int(self.model.config.vocab_size)
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        self._guides: _GuideStep | None = None  # made with the first guided request
        self._batch = _DecodeBatch()

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
        req.backend_state = _SeqState(generator=generator, matcher=matcher)

    def release(self, req: GenRequest) -> None:
        """Nothing to free at once: its row stays in the batch until the next step keeps only the
        requests that are still active."""

    @torch.inference_mode()
    def step(self, batch: list[GenRequest]) -> list[StepResult]:
        joining = [req for req in batch if not req.backend_state.length]  # type: ignore[union-attr]
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

    # -- the model call ------------------------------------------------------------------------
    def _forward(
        self, active: list[GenRequest], joining: list[GenRequest]
    ) -> dict[int, torch.Tensor]:
        """One forward of every active request: the decoding rows' last token and the joining
        rows' prompts, each right-aligned in an input as wide as the longest prompt (1 when
        nobody joins), over the batch's caches. The last position's logits of each request, by
        id(request), on the CPU."""
        from transformers import DynamicCache

        cache = self._batch
        joined = {id(req) for req in joining}
        cache.keep([req for req in active if id(req) not in joined])
        decoding = cache.reqs
        span = max((len(req.prompt) for req in joining), default=1)
        rows = len(decoding) + len(joining)
        ids = torch.zeros((rows, span), dtype=torch.long)
        fresh = torch.zeros((rows, span), dtype=torch.long)  # the columns this forward fills
        positions = torch.zeros((rows, span), dtype=torch.long)
        for row, req in enumerate(decoding):
            ids[row, -1] = req.generated[-1]
            fresh[row, -1] = 1
            positions[row, -1] = req.backend_state.length  # type: ignore[union-attr]
        for row, req in enumerate(joining, start=len(decoding)):
            length = len(req.prompt)
            ids[row, span - length :] = torch.tensor(req.prompt, dtype=torch.long)
            fresh[row, span - length :] = 1
            positions[row, span - length :] = torch.arange(length)
        device = self.device
        fresh = fresh.to(device)
        if cache.width:
            assert cache.mask is not None
            # Joining rows have no past: empty, masked columns in front of their prompt.
            past = torch.cat([cache.mask, cache.mask.new_zeros((len(joining), cache.width))])
            layers = [
                (_append_rows(k, len(joining)), _append_rows(v, len(joining)))
                for k, v in cache.layers
            ]
            mask = torch.cat([past, fresh], dim=1)
            past_key_values = DynamicCache(layers)
        else:
            mask, past_key_values = fresh, DynamicCache()
        out = self.model(
            input_ids=ids.to(device),
            attention_mask=mask,
            position_ids=positions.to(device),
            past_key_values=past_key_values,
            use_cache=True,
        )
        cache.reqs = decoding + joining
        cache.layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        cache.mask, cache.width = mask, cache.width + span
        for req in decoding:
            req.backend_state.length += 1  # type: ignore[union-attr]
        for req in joining:
            req.backend_state.length = len(req.prompt)  # type: ignore[union-attr]
        cache.compact()
        # Sampling runs on the CPU with each request's own seeded generator.
        last = out.logits[:, -1].float().cpu()  # one copy for the batch, not one per row
        return {id(req): last[row] for row, req in enumerate(cache.reqs)}


def _append_rows(tensor: torch.Tensor, count: int) -> torch.Tensor:
    """[rows, heads, width, dim] -> [rows + count, heads, width, dim], the new rows zero."""
    if not count:
        return tensor
    return torch.nn.functional.pad(tensor, (0, 0, 0, 0, 0, 0, 0, count))
