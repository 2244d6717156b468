"""hf backend: a local transformers causal LM, on the CPU or, where one is present, a CUDA GPU
(the stand-in decoding on a GPU; TensorRT-LLM is not involved).

The requests that join in a step are prefilled together in one forward over their prompts,
left-padded to the longest; all other active requests decode together in ONE batched forward per
step over one KV tensor per layer (:class:`_DecodeBatch`): rows left-padded to a common width,
masked, with per-request position ids. Prefilling joiners one by one made a step's time grow with
how many requests happened to arrive together: a closed-loop client whose requests start and end
in step had 64 forwards in one step, the same load spread over time one or two per step. The batch is kept from step to step and
only changes where requests join or leave, with a few tensor operations per layer whatever the
batch size: padding and splitting every request's cache at every step cost thousands of small
operations per step on a 64-request batch, the engine's whole CPU budget on a GPU. Torch and
transformers are imported here only, so the synthetic mode never pays for them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .request import GenRequest
from .sampling import select_token
from .scheduler import StepResult

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, heads, len, dim]


@dataclass(slots=True)
class _SeqState:
    generator: torch.Generator
    kv: KV | None = None  # its own cache from the prefill, until it joins the decode batch
    length: int = 0  # tokens in its cache
    prefilled: bool = False
    matcher: object = None  # xgrammar.GrammarMatcher of a guided request


class _DecodeBatch:
    """The KV caches of the requests that decode together, one [rows, heads, width, dim] tensor
    per layer (keys and values), each row's tokens right-aligned (left padding masked out).

    From one step to the next the rows stay the same unless a request joined or left; then the
    batch is rebuilt with one selection, one padding per joining request and one concatenation
    per layer.
    """

    def __init__(self) -> None:
        self.reqs: list[GenRequest] = []
        self.layers: KV = []
        self.width = 0  # columns of the cache tensors

    def states(self) -> list[_SeqState]:
        return [r.backend_state for r in self.reqs]  # type: ignore[misc]

    def arrange(self, reqs: list[GenRequest]) -> None:
        """Make the rows exactly `reqs`: the rows kept stay in their order, the requests joining
        (which bring their own prefill cache) are appended."""
        wanted = {id(req) for req in reqs}
        kept = [row for row, req in enumerate(self.reqs) if id(req) in wanted]
        if len(kept) == len(self.reqs) == len(reqs):
            return
        present = {id(self.reqs[row]) for row in kept}
        joining = [req for req in reqs if id(req) not in present]
        rows = [self.reqs[row] for row in kept] + joining
        width = max(req.backend_state.length for req in rows)  # type: ignore[union-attr]
        template = self.layers or joining[0].backend_state.kv  # type: ignore[union-attr]
        layers: KV = []
        for layer in range(len(template)):
            keys: list[torch.Tensor] = []
            values: list[torch.Tensor] = []
            if kept:
                k, v = self.layers[layer]
                index = torch.tensor(kept, device=k.device)
                keys.append(_left_pad(k.index_select(0, index), width))
                values.append(_left_pad(v.index_select(0, index), width))
            for req in joining:
                k, v = req.backend_state.kv[layer]  # type: ignore[union-attr]
                keys.append(_left_pad(k, width))
                values.append(_left_pad(v, width))
            layers.append((torch.cat(keys), torch.cat(values)))
        for req in joining:
            req.backend_state.kv = None  # type: ignore[union-attr]  # its rows live in the batch now
        self.reqs, self.layers, self.width = rows, layers, width

    def clear(self) -> None:
        self.reqs, self.layers, self.width = [], [], 0


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, heads, length, dim] -> [rows, heads, width, dim], padding (or trimming the common
    padding) on the left."""
    length = tensor.shape[2]
    if length == width:
        return tensor
    if length > width:
        return tensor[:, :, length - width :]
    return torch.nn.functional.pad(tensor, (0, 0, width - length, 0))


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
        # Its row stays in the decode batch until the next step arranges the batch without it.
        if req.backend_state is not None:
            req.backend_state.kv = None  # type: ignore[attr-defined]

    @torch.inference_mode()
    def step(self, batch: list[GenRequest]) -> list[StepResult]:
        rows: list[torch.Tensor] = [None] * len(batch)  # type: ignore[list-item]
        joining: list[int] = []
        decoding: list[GenRequest] = []
        positions: list[int] = []
        for i, req in enumerate(batch):
            if not req.backend_state.prefilled:  # type: ignore[union-attr]
                joining.append(i)
            else:
                decoding.append(req)
                positions.append(i)
        if joining:
            prefilled = self._prefill([batch[i] for i in joining])
            for i, logits in zip(joining, prefilled, strict=True):
                rows[i] = logits
        if decoding:
            for i, logits in zip(positions, self._decode(decoding), strict=True):
                rows[i] = logits
        elif self._batch.reqs:
            self._batch.clear()  # nobody decodes: let the caches go
        guided = [i for i, req in enumerate(batch) if req.backend_state.matcher is not None]  # type: ignore[union-attr]
        matchers = [batch[i].backend_state.matcher for i in guided]  # type: ignore[union-attr]
        if guided:
            assert self._guides is not None
            masked = torch.stack([rows[i] for i in guided]).to(torch.float32)
            self._guides.mask(matchers, masked)
            for i, logits in zip(guided, masked, strict=True):
                rows[i] = logits
        results = [
            select_token(logits, req, req.backend_state.generator)  # type: ignore[union-attr]
            for req, logits in zip(batch, rows, strict=True)
        ]
        if guided:
            assert self._guides is not None
            tokens = [results[i][0] for i in guided]
            self._guides.accept([batch[i] for i in guided], matchers, tokens)
        return results

    # -- model calls ---------------------------------------------------------------------------
    def _prefill(self, reqs: list[GenRequest]) -> list[torch.Tensor]:
        """One forward over the prompts of the requests joining in this step, each left-padded
        to the longest (masked, with its own position ids); each keeps its own slice of the
        cache until it joins the decode batch. The last position's logits of each, on the CPU."""
        from transformers import DynamicCache

        lengths = [len(req.prompt) for req in reqs]
        width = max(lengths)
        ids = torch.zeros((len(reqs), width), dtype=torch.long)
        mask = torch.zeros((len(reqs), width), dtype=torch.long)
        for row, (req, length) in enumerate(zip(reqs, lengths, strict=True)):
            ids[row, width - length :] = torch.tensor(req.prompt, dtype=torch.long)
            mask[row, width - length :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        device = self.device
        out = self.model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            past_key_values=DynamicCache(),
            use_cache=True,
        )
        layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        for row, (req, length) in enumerate(zip(reqs, lengths, strict=True)):
            state: _SeqState = req.backend_state  # type: ignore[assignment]
            state.kv = [
                (k[row : row + 1, :, width - length :], v[row : row + 1, :, width - length :])
                for k, v in layers
            ]
            state.length = length
            state.prefilled = True
        # Sampling runs on the CPU with each request's own seeded generator.
        last = out.logits[:, -1].float().cpu()  # one copy for all of them
        return list(last)

    def _decode(self, reqs: list[GenRequest]) -> list[torch.Tensor]:
        """One batched forward of each request's last token over the decode batch's caches."""
        from transformers import DynamicCache

        batch = self._batch
        batch.arrange(reqs)
        states = batch.states()
        lengths = torch.tensor([s.length for s in states], dtype=torch.long)
        width = batch.width
        device = self.device
        # Row r's tokens are the last lengths[r] columns of the cache, plus the new one.
        mask = torch.arange(width + 1) >= (width - lengths)[:, None]
        input_ids = torch.tensor(
            [[r.generated[-1]] for r in batch.reqs], dtype=torch.long, device=device
        )
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask.to(device=device, dtype=torch.long),
            position_ids=lengths[:, None].to(device),
            past_key_values=DynamicCache(batch.layers),
            use_cache=True,
        )
        batch.layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        batch.width = width + 1
        for state in states:
            state.length += 1
        last = out.logits[:, -1].float().cpu()  # one copy for the batch, not one per row
        by_request = {id(req): row for row, req in enumerate(batch.reqs)}
        return [last[by_request[id(req)]] for req in reqs]
