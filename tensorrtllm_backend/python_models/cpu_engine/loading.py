"""What both CPU-engine slots build at start: the backend of an engine config, and the guide
compiler that enforces guided decoding (as TensorRT-LLM's `guided_decoding_backend: xgrammar`)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import NamedTuple

from ...common.cpu_engine_config import EngineConfig
from ...common.guides import Guide, GuideCompiler, GuideError
from ..kv_events import KvEventPublisher, publisher_from_settings
from .block_cache import BlockTable
from .scheduler import Backend

# Tokens the prefix cache holds when no budget is set (max_tokens_in_paged_kv_cache unset).
DEFAULT_CACHED_TOKENS = 65536


class PrefixCache(NamedTuple):
    """An engine's prefix cache, and the publisher of its KV-cache events (None: off)."""

    table: BlockTable
    events: KvEventPublisher | None

    def close(self) -> None:
        if self.events is not None:
            self.events.close()


def prefix_cache(block_size: int, max_tokens: int | None = None, rank: int = 0) -> PrefixCache:
    """A prefix cache of blocks of `block_size` tokens, at most `max_tokens` of them
    (TensorRT-LLM's max_tokens_in_paged_kv_cache), its changes published as vLLM's KV-cache
    events when TRTLLM_KV_EVENTS_ENDPOINT is set (engine instance `rank` on that port + rank).
    The first event is AllBlocksCleared: a subscriber drops what an earlier engine held."""
    publisher = publisher_from_settings(rank)
    budget = max_tokens or DEFAULT_CACHED_TOKENS
    on_events = publisher.publish if publisher is not None else None
    return PrefixCache(BlockTable(block_size, max(1, budget // block_size), on_events), publisher)


def make_backend(config: EngineConfig, reuse: BlockTable | None = None) -> Backend:
    """The synthetic, scripted or hf backend a CPU engine dir describes; `reuse`: the prefix
    cache (hf's reuses keys and values; the synthetic engine's is bookkeeping; the scripted
    engine has none)."""
    section = config.cpu_engine
    if section.mode == "scripted":
        from .scripted import ScriptedBackend

        return ScriptedBackend(
            tokenizer_dir=config.checkpoint_path(),
            vocab_size=config.pretrained_config.vocab_size,
            eos_token_id=section.eos_token_id,
            ttft_ms=section.ttft_ms,
            itl_ms=section.itl_ms,
        )
    if section.mode == "synthetic":
        from .synthetic import SyntheticBackend

        return SyntheticBackend(
            vocab_size=config.pretrained_config.vocab_size,
            eos_token_id=section.eos_token_id,
            ttft_ms=section.ttft_ms,
            itl_ms=section.itl_ms,
            seed=section.seed,
            reuse=reuse,
        )
    from .hf import HFBackend

    return HFBackend(config.checkpoint_path(), device=section.device, reuse=reuse)


class EngineGuides:
    """The engine's guide compiler: xgrammar over the engine's tokenizer. Built in a thread at
    start, since importing xgrammar and loading the tokenizer take seconds that unguided
    requests need not wait for; a guided request waits."""

    def __init__(self, tokenizer_dir: Path, vocab_size: int) -> None:
        self._ready = threading.Event()
        self._compiler: GuideCompiler | None = None
        self._error: str | None = None
        threading.Thread(
            target=self._load, args=(tokenizer_dir, vocab_size), name="guide-compiler", daemon=True
        ).start()

    def _load(self, tokenizer_dir: Path, vocab_size: int) -> None:
        try:
            from ...common.tokenization import load_tokenizer

            compiler = GuideCompiler(load_tokenizer(tokenizer_dir), vocab_size)
            compiler.tokenizer_info  # noqa: B018 - build it now, not on the first request
            self._compiler = compiler
        except Exception as exc:  # reported to guided requests, not fatal to the model
            self._error = f"guided decoding is unavailable: {exc}"
        finally:
            self._ready.set()

    def compile(self, guide_type: str, guide: str | None) -> object:
        """The compiled grammar (blocking, cached); GuideError says why it cannot be enforced."""
        self._ready.wait()
        if self._compiler is None:
            raise GuideError(self._error or "guided decoding is unavailable")
        try:
            return self._compiler.compile(Guide(guide_type, guide))
        except ValueError as exc:  # GuideError, or xgrammar's own
            raise GuideError(str(exc)) from None
