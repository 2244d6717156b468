"""`GET /tokenizer_info`: vLLM's description of the served tokenizer, which clients that tokenize
remotely read instead of loading the tokenizer's files (lm-evaluation-harness's
`tokenizer_backend=remote` checks for it, then asks `/tokenize` and `/detokenize` for the rest).

vLLM answers the tokenizer's `init_kwargs` less `vocab_file` and `merges_file`, which also carry
the absolute paths and loader options of the machine that loaded it (`name_or_path`,
`tokenizer_file`, `local_files_only`, ...). This answers a fixed set of vLLM's fields instead:
those a remote tokenizer needs (:class:`TokenizerInfo` says why each is there), nothing about
where the files are.
"""

from __future__ import annotations

from typing import Any, TypedDict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..chat.core import ChatCore
from ..web.endpoints import Endpoints

# Encoded with and without special tokens to see which ones the tokenizer adds.
_PROBE = "a"


class TokenizerInfo(TypedDict):
    """The answer, field by field (vLLM's names)."""

    # vLLM's one required field: the class that loaded the tokenizer, for clients that pick
    # their own implementation by it.
    tokenizer_class: str
    # The special tokens' text: lm-eval encodes eos_token and bos_token through /tokenize for
    # their ids (the prefix a loglikelihood without context is scored after) and sends eos_token
    # as a stop string; pad_token and unk_token complete what a tokenizer config names.
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    unk_token: str | None
    # Whether encoding with special tokens (/tokenize's default for a prompt, and how
    # /v1/completions encodes a text prompt) adds them: a client counting the tokens the server
    # will see needs it. Measured, not read from the config: a tokenizer.json post-processor
    # adds BOS while transformers' add_bos_token attribute says false.
    add_bos_token: bool
    add_eos_token: bool
    # Added tokens by id (their text), so a client knows which ids are special without a round
    # trip per id.
    added_tokens_decoder: dict[str, str]
    # The template /v1/chat/completions renders messages with: a remote tokenizer renders chats
    # with it (lm-eval's RemoteTokenizer.apply_chat_template).
    chat_template: str | dict[str, str] | None
    # The longest sequence a client should build: the tokenizer's own limit, capped by the
    # engine's max_seq_len, which refuses anything longer.
    model_max_length: int


def tokenizer_info(core: ChatCore) -> TokenizerInfo:
    tokenizer = core.generator.tokenizer
    plain = list(tokenizer.encode(_PROBE, add_special_tokens=False))
    full = list(tokenizer.encode(_PROBE, add_special_tokens=True))
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    added: dict[int, Any] = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return {
        "tokenizer_class": type(tokenizer).__name__,
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "unk_token": tokenizer.unk_token,
        "add_bos_token": bos is not None and full[:1] == [bos] and plain[:1] != [bos],
        "add_eos_token": eos is not None and full[-1:] == [eos] and plain[-1:] != [eos],
        "added_tokens_decoder": {
            str(token_id): str(getattr(token, "content", token))
            for token_id, token in sorted(added.items())
        },
        "chat_template": getattr(tokenizer, "chat_template", None),
        "model_max_length": min(int(tokenizer.model_max_length), core.generator.limits.max_seq_len),
    }


def tokenizer_info_routes(endpoints: Endpoints) -> list[Route]:
    """`GET /tokenizer_info`, relative to the service's root."""

    async def info_endpoint(request: Request) -> Response:
        return JSONResponse(tokenizer_info(endpoints.core()))

    return [Route("/tokenizer_info", endpoints.handler(info_endpoint), methods=["GET"])]
