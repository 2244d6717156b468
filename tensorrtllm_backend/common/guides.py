"""Guides (JSON schema, regex, EBNF grammar, structural tag) checked and compiled with xgrammar.

Two places compile guides against a tokenizer's vocabulary: the service, to turn a guide that
cannot be enforced into an HTTP 400 before Triton sees it (so a bad guide never takes an engine
slot), and the CPU engine, which enforces the compiled grammar token by token. Both use
:class:`GuideCompiler`.

A guide is the client's text, and compiling one costs from milliseconds to minutes (a schema
of a few thousand bounded strings took xgrammar 88 s here), so compilation is bounded on every
side:

- it runs in a small thread pool of the compiler's own, never on the event loop or the
  default executor, and one compilation serves every request waiting for the same guide;
- a guide that does not compile within `timeout_s` of its start is refused (GuideError: the
  service's 400); xgrammar cannot be interrupted, so its thread finishes in the background;
- at most `max_pending` distinct guides compile or wait at once; beyond that, and for a guide
  that waited `timeout_s` without starting, GuideBusyError (the service's 503 + Retry-After:
  the compiler is shared by every client, so a retry can succeed);
- compiled grammars are cached by (type, hash of the guide) in an LRU bounded in bytes;
  failures (timeouts included) are cached for `failure_ttl_s`, so repeating a bad guide costs
  nothing.

xgrammar (and the torch it imports) is imported on first use, or by :meth:`warm_up`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Protocol

# Guide types that need guide text; `json` alone means "any JSON value".
NEEDS_GUIDE = frozenset({"json_schema", "regex", "ebnf_grammar", "structural_tag"})
CACHE_BYTES = 256 * 1024 * 1024
COMPILE_TIMEOUT_S = 10.0
MAX_PENDING = 16
FAILURE_TTL_S = 60.0
MAX_FAILURES = 1024  # failures remembered at once (oldest forgotten first)
# JSON nesting of a schema or structural tag. Real schemas stay far below; deeper ones only
# exhaust the recursion of the JSON parser and of jsonschema.
MAX_DEPTH = 64
# Bytes counted per cache entry beyond the compiled grammar (key, entry, bookkeeping).
_ENTRY_OVERHEAD = 256
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


class GuideBusyError(RuntimeError):
    """The compiler has more guides to compile than it takes: retry shortly (HTTP 503)."""


def guide_key(guided: GuidedDecoding) -> tuple[str, bytes]:
    """The cache key of a guide: its type and a digest of its text (keys stay small however
    long the guides are)."""
    text = (guided.guide or "").encode("utf-8", "surrogatepass")
    return guided.type, hashlib.blake2b(text, digest_size=16).digest()


def check_guide_present(guided: GuidedDecoding) -> None:
    """The check that costs nothing: a guide where the type needs one."""
    guide = guided.guide
    if guided.type in NEEDS_GUIDE and not (guide and guide.strip()):
        raise GuideError(f"guided_decoding type {guided.type!r} needs a guide: send it in `guide`")


def check_guide_text(guided: GuidedDecoding) -> None:
    """Checks that need no tokenizer: a guide where one is needed, JSON where JSON is expected,
    nested at most MAX_DEPTH deep, and a JSON Schema that is one (the meta-schema check,
    clearer than the compiler's). Runs in the compiler's threads."""
    check_guide_present(guided)
    guide = guided.guide
    if guided.type not in ("json_schema", "structural_tag") or guide is None:
        return
    try:
        value = json.loads(guide)
    except json.JSONDecodeError as error:
        raise GuideError(f"guided_decoding guide is not valid JSON: {error}") from None
    except RecursionError:
        raise GuideError(_too_deep()) from None
    if json_depth(value) > MAX_DEPTH:
        raise GuideError(_too_deep())
    if guided.type == "json_schema":
        check_json_schema(value)


def _too_deep() -> str:
    return f"guided_decoding guide is nested more than {MAX_DEPTH} levels deep: flatten it"


def json_depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (a scalar: 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


def check_json_schema(schema: Any) -> None:
    """Raise GuideError unless `schema` is a valid JSON Schema (object or boolean), by the
    meta-schema of the draft its `$schema` names (2020-12 when it names none or one we do not
    know)."""
    import jsonschema_rs

    if not isinstance(schema, dict | bool):
        raise GuideError(
            f"guided_decoding guide is not a JSON Schema: expected an object, got "
            f"{type(schema).__name__}"
        )
    try:
        _meta_validator(schema).validate(schema)
    except jsonschema_rs.ValidationError as error:
        where = "/".join(str(part) for part in error.instance_path)
        raise GuideError(
            f"guided_decoding guide is not a valid JSON Schema: {error.message}"
            + (f" (at /{where})" if where else "")
        ) from None


_META_VALIDATORS: dict[str, Any] = {}


def _meta_validator(schema: dict[str, Any] | bool) -> Any:
    """A jsonschema-rs validator of the meta-schema `schema` declares, built once per draft.

    jsonschema-rs checks a 250 KB schema in ~2 ms where the pure-Python jsonschema took ~0.5 s
    holding the GIL in slices, which stalled every stream of the worker. The draft is picked,
    and its meta-schema taken, from jsonschema's bundled copies: jsonschema-rs's own meta check
    would fetch an unknown `$schema` URI over the network, a request the client chose."""
    import jsonschema
    import jsonschema_rs

    draft = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    meta = _META_VALIDATORS.get(draft.__name__)
    if meta is None:
        meta = jsonschema_rs.validator_for(draft.META_SCHEMA, offline=True)
        _META_VALIDATORS[draft.__name__] = meta
    return meta


@dataclass(eq=False)
class _Job:
    """One guide being compiled: `started` resolves when a thread takes it (with the start
    time), `result` with the compiled grammar or the GuideError."""

    started: Future[float] = field(default_factory=Future)
    result: Future[Any] = field(default_factory=Future)


@dataclass(slots=True)
class _Failure:
    error: GuideError
    expires: float


class GuideCompiler:
    """xgrammar compiler for one tokenizer, bounded in time, concurrency and memory (see the
    module's docstring). Thread-safe; :meth:`compile` blocks its caller, :meth:`check` awaits
    without blocking the event loop."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int | None = None,
        *,
        cache_bytes: int = CACHE_BYTES,
        max_threads: int = 2,
        timeout_s: float = COMPILE_TIMEOUT_S,
        max_pending: int = MAX_PENDING,
        failure_ttl_s: float = FAILURE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._cache_bytes = cache_bytes
        self._max_threads = max_threads
        self.timeout_s = timeout_s
        self._max_pending = max_pending
        self._failure_ttl_s = failure_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._compiler_lock = threading.Lock()
        self._compiler: Any = None
        self._tokenizer_info: Any = None
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="guide-compiler")
        self._cache: OrderedDict[tuple[str, bytes], tuple[Any, int]] = OrderedDict()
        self._cached_bytes = 0
        self._failures: dict[tuple[str, bytes], _Failure] = {}
        self._pending: dict[tuple[str, bytes], _Job] = {}

    @property
    def tokenizer_info(self) -> Any:
        """The tokenizer's xgrammar.TokenizerInfo (built on first use: seconds for large vocabs)."""
        self._ensure_compiler()
        return self._tokenizer_info

    def warm_up(self) -> None:
        """Import xgrammar and the schema checker and build the tokenizer's info now (blocking,
        seconds), so that the first guided request does not pay for it."""
        _meta_validator(True)

        self._ensure_compiler()

    def warm_up_in_background(self) -> None:
        """:meth:`warm_up` in one of the compiler's threads (guided requests wait for it)."""
        self._pool.submit(self.warm_up)

    @property
    def cached_bytes(self) -> int:
        """Bytes the cache of compiled grammars holds (an estimate: xgrammar's own count)."""
        return self._cached_bytes

    def _ensure_compiler(self) -> Any:
        with self._compiler_lock:
            if self._compiler is None:
                import xgrammar

                info = xgrammar.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self._vocab_size
                )
                self._tokenizer_info = info
                # max_threads: xgrammar's own parallelism within one compilation.
                self._compiler = xgrammar.GrammarCompiler(
                    info, max_threads=self._max_threads, cache_enabled=False
                )
            return self._compiler

    # -- the cache ---------------------------------------------------------------------------
    def cached(self, guided: GuidedDecoding) -> Any:
        """The compiled grammar if this guide compiled before; GuideError if it failed within
        the last failure_ttl_s; None otherwise."""
        return self._lookup(guide_key(guided))

    def _lookup(self, key: tuple[str, bytes]) -> Any:
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                self._cache.move_to_end(key)
                return entry[0]
            failure = self._failures.get(key)
            if failure is not None and failure.expires <= self._clock():
                del self._failures[key]
                failure = None
        if failure is not None:
            raise failure.error
        return None

    def _remember(self, key: tuple[str, bytes], outcome: Any) -> None:
        with self._lock:
            if isinstance(outcome, GuideError):
                self._failures[key] = _Failure(outcome, self._clock() + self._failure_ttl_s)
                self._prune_failures()
                return
            failure = self._failures.get(key)
            if key in self._cache or (failure is not None and failure.expires > self._clock()):
                return  # a twin, or refused meanwhile (a timeout stays refused until its TTL)
            size = int(getattr(outcome, "memory_size_bytes", 0)) + _ENTRY_OVERHEAD
            if size > self._cache_bytes:
                return
            self._cache[key] = (outcome, size)
            self._cached_bytes += size
            while self._cached_bytes > self._cache_bytes:
                _, (_, evicted) = self._cache.popitem(last=False)
                self._cached_bytes -= evicted

    def _prune_failures(self) -> None:
        """Drop expired failures, and the oldest beyond MAX_FAILURES (called locked)."""
        now = self._clock()
        for key in [k for k, f in self._failures.items() if f.expires <= now]:
            del self._failures[key]
        while len(self._failures) > MAX_FAILURES:
            del self._failures[next(iter(self._failures))]

    # -- compiling ---------------------------------------------------------------------------
    def _job(self, key: tuple[str, bytes], guided: GuidedDecoding) -> _Job:
        """The compilation of `guided`, started now or already under way."""
        with self._lock:
            job = self._pending.get(key)
            if job is not None:
                return job
            if len(self._pending) >= self._max_pending:
                raise GuideBusyError(
                    f"{len(self._pending)} guides are being compiled, the most this server "
                    "takes at once: retry shortly"
                )
            job = self._pending[key] = _Job()
        self._pool.submit(self._run, key, guided, job)
        return job

    def _run(self, key: tuple[str, bytes], guided: GuidedDecoding, job: _Job) -> None:
        job.started.set_result(self._clock())
        try:
            check_guide_text(guided)
            outcome = self._compile(guided)
        except GuideError as error:
            outcome = error
        except BaseException as error:  # a compiler bug: the waiters see it, nothing is cached
            with self._lock:
                self._pending.pop(key, None)
            job.result.set_exception(error)
            return
        self._remember(key, outcome)
        with self._lock:
            self._pending.pop(key, None)
        job.result.set_result(outcome)

    def _timed_out(self, key: tuple[str, bytes], guided: GuidedDecoding) -> GuideError:
        error = GuideError(
            f"guided_decoding {guided.type} guide did not compile within {self.timeout_s:g} s: "
            "send a smaller or simpler one"
        )
        self._remember(key, error)
        return error

    def _busy(self) -> GuideBusyError:
        return GuideBusyError(
            f"the guide compiler is busy (a guide waited {self.timeout_s:g} s for a free "
            "thread): retry shortly"
        )

    @staticmethod
    def _outcome(value: Any) -> Any:
        if isinstance(value, GuideError):
            raise value
        return value

    def compile(self, guided: GuidedDecoding) -> Any:
        """The xgrammar.CompiledGrammar of a guide (blocking; cached). GuideError if it is
        invalid or does not compile in time; GuideBusyError if the compiler is full."""
        key = guide_key(guided)
        found = self._lookup(key)
        if found is not None:
            return found
        job = self._job(key, guided)
        try:
            started = job.started.result(self.timeout_s)
        except FutureTimeout:
            raise self._busy() from None
        remaining = started + self.timeout_s - self._clock()
        try:
            return self._outcome(job.result.result(max(0.0, remaining)))
        except FutureTimeout:
            raise self._timed_out(key, guided) from None

    async def check(self, guided: GuidedDecoding) -> None:
        """Compile without blocking the event loop (cached, one compilation per guide however
        many requests wait for it); the errors of :meth:`compile`."""
        key = guide_key(guided)
        if self._lookup(key) is not None:
            return
        job = self._job(key, guided)
        # shield: a waiter that gives up (timeout, its client left) leaves the others waiting.
        try:
            started = await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(job.started)), self.timeout_s
            )
        except TimeoutError:
            raise self._busy() from None
        remaining = started + self.timeout_s - self._clock()
        try:
            value = await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(job.result)), max(0.0, remaining)
            )
        except TimeoutError:
            raise self._timed_out(key, guided) from None
        self._outcome(value)

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

    def close(self) -> None:
        """Stop taking compilations (running ones finish in their threads)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
