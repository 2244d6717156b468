"""Guides (JSON schema, regex, EBNF grammar, structural tag) checked and compiled with xgrammar.

Two places compile guides against a tokenizer's vocabulary: the service, to turn a guide that
cannot be enforced into an HTTP 400 before Triton sees it (so a bad guide never takes an engine
slot), and the CPU engine, which enforces the compiled grammar token by token. Both use
:class:`GuideCompiler`. Compiling costs milliseconds to seconds for large schemas, so results are
cached by (type, guide) and the service compiles in a thread (:meth:`GuideCompiler.check`), never
on the event loop. xgrammar (and the torch it imports) is imported on first use only.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

# Guide types that need guide text; `json` alone means "any JSON value".
NEEDS_GUIDE = frozenset({"json_schema", "regex", "ebnf_grammar", "structural_tag"})
CACHE_SIZE = 256
# Compact JSON: with free whitespace a weak model can emit spaces for ever and never finish.
_ANY_JSON_SCHEMA = "{}"
# xgrammar's C++ messages start with a time stamp, a source location and sometimes the failed
# check: noise to a client that wants to know what is wrong with its guide.
_NATIVE_PREFIX = re.compile(r"^(\[[0-9:]+\] \S+:\d+: )?(Check failed: .*? is false: )?")


class GuidedDecoding(Protocol):
    """A guide as TensorRT-LLM's tensors carry it: `guided_decoding_guide_type` and
    `guided_decoding_guide` (the service's request schema and :class:`Guide` both fit)."""

    @property
    def type(self) -> str: ...

    @property
    def guide(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Guide:
    """A guide read from a request's tensors (inside the engine)."""

    type: str
    guide: str | None = None


class GuideError(ValueError):
    """The guide cannot be enforced as sent; the message says why (the compiler's words).

    `param` is the request field it came from, for the service's 400."""

    param = "guided_decoding"


def guide_key(guided: GuidedDecoding) -> tuple[str, str]:
    return guided.type, guided.guide or ""


def check_guide_text(guided: GuidedDecoding) -> None:
    """Checks that need no tokenizer: a guide where one is needed, JSON where JSON is expected,
    and a JSON Schema that is one (jsonschema's meta-schema check, clearer than the compiler's)."""
    guide = guided.guide
    if guided.type in NEEDS_GUIDE and not (guide and guide.strip()):
        raise GuideError(f"guided_decoding type {guided.type!r} needs a guide: send it in `guide`")
    if guided.type not in ("json_schema", "structural_tag") or guide is None:
        return
    try:
        value = json.loads(guide)
    except json.JSONDecodeError as error:
        raise GuideError(f"guided_decoding guide is not valid JSON: {error}") from None
    if guided.type == "json_schema":
        check_json_schema(value)


def check_json_schema(schema: Any) -> None:
    """Raise GuideError unless `schema` is a valid JSON Schema (object or boolean)."""
    import jsonschema

    if not isinstance(schema, dict | bool):
        raise GuideError(
            f"guided_decoding guide is not a JSON Schema: expected an object, got "
            f"{type(schema).__name__}"
        )
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        raise GuideError(
            f"guided_decoding guide is not a valid JSON Schema: {error.message}"
        ) from None


class GuideCompiler:
    """xgrammar compiler for one tokenizer, with an LRU cache of compiled grammars.

    Thread-safe: xgrammar compiles in native code outside the GIL, and concurrent requests for
    one guide share a single compilation (the service's :meth:`check`). Failures are cached too,
    so a client repeating a bad guide costs one compilation.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int | None = None,
        *,
        cache_size: int = CACHE_SIZE,
        max_threads: int = 2,
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._cache_size = cache_size
        self._max_threads = max_threads
        self._lock = threading.Lock()
        self._compiler: Any = None
        self._tokenizer_info: Any = None
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._pending: dict[tuple[str, str], asyncio.Future[Any]] = {}

    @property
    def tokenizer_info(self) -> Any:
        """The tokenizer's xgrammar.TokenizerInfo (built on first use: seconds for large vocabs)."""
        self._ensure_compiler()
        return self._tokenizer_info

    def _ensure_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar

                info = xgrammar.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self._vocab_size
                )
                self._tokenizer_info = info
                self._compiler = xgrammar.GrammarCompiler(
                    info, max_threads=self._max_threads, cache_enabled=False
                )
            return self._compiler

    def cached(self, guided: GuidedDecoding) -> Any:
        """The compiled grammar if this guide was compiled before (GuideError if it failed)."""
        with self._lock:
            entry = self._cache.get(guide_key(guided))
            if entry is not None:
                self._cache.move_to_end(guide_key(guided))
        if isinstance(entry, GuideError):
            raise entry
        return entry

    def compile(self, guided: GuidedDecoding) -> Any:
        """The xgrammar.CompiledGrammar of a guide (blocking; cached). GuideError if invalid."""
        entry = self.cached(guided)
        if entry is not None:
            return entry
        key = guide_key(guided)
        try:
            check_guide_text(guided)
            entry = self._compile(guided)
        except GuideError as error:
            entry = error
        with self._lock:
            self._cache[key] = entry
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        if isinstance(entry, GuideError):
            raise entry
        return entry

    def _compile(self, guided: GuidedDecoding) -> Any:
        compiler = self._ensure_compiler()
        guide = guided.guide or ""
        try:
            if guided.type == "json":
                schema = guide if guide.strip() else _ANY_JSON_SCHEMA
                return compiler.compile_json_schema(schema, any_whitespace=False)
            if guided.type == "json_schema":
                return compiler.compile_json_schema(guide, any_whitespace=False)
            if guided.type == "regex":
                return compiler.compile_regex(guide)
            if guided.type == "ebnf_grammar":
                return compiler.compile_grammar(guide)
            return compiler.compile_structural_tag(guide)
        except (RuntimeError, ValueError, TypeError) as error:
            message = _NATIVE_PREFIX.sub("", str(error).strip()) or type(error).__name__
            raise GuideError(
                f"guided_decoding {guided.type} guide does not compile: {message}"
            ) from None

    async def check(self, guided: GuidedDecoding) -> None:
        """Compile in a worker thread (cached, one compilation per guide however many requests
        wait for it); GuideError if the guide cannot be enforced."""
        if self.cached(guided) is not None:
            return
        check_guide_text(guided)
        key = guide_key(guided)
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(self.compile, guided))
            self._pending[key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        await asyncio.shield(pending)
