"""Encrypted reasoning for stateless Responses clients (`include: ["reasoning.encrypted_content"]`
with `store: false`, as Codex sends): a reasoning item carries its thinking sealed with the
deployment's key, and the client sends the item back with the next request.

The seal is AES-256-GCM (authenticated): a blob this deployment did not make, or one changed on
the way, does not open, and the request is a 400. The key is TRTLLM_REASONING_KEY (32 bytes,
base64); without it, `bentoml serve` makes one at start that its workers share, so blobs do not
outlive the service: set the key where clients keep sessions across restarts or replicas.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_ENV = "TRTLLM_REASONING_KEY"
_CONTEXT = b"bentotrtllm reasoning v1"  # bound to every seal: a blob of another kind fails
_NONCE = 12
MAX_BLOB_CHARS = 4 * 1024 * 1024


def new_key() -> str:
    """A fresh key, as TRTLLM_REASONING_KEY takes it."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()


def share_reasoning_key() -> None:
    """Without TRTLLM_REASONING_KEY, one for this service: `bentoml serve` imports service.py
    before it starts the workers, which inherit its environment."""
    if not os.environ.get(KEY_ENV):
        os.environ[KEY_ENV] = new_key()


class ReasoningSeal:
    """Seals and opens reasoning text with one key."""

    def __init__(self, key: str) -> None:
        try:
            raw = base64.urlsafe_b64decode(key.encode())
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise ValueError(f"{KEY_ENV} must be 32 bytes in base64 (make one: a random 32-byte "
                             "value, base64-encoded)")  # fmt: skip
        self._aead = AESGCM(raw)

    def seal(self, text: str) -> str:
        nonce = secrets.token_bytes(_NONCE)
        plain = json.dumps({"thinking": text}).encode()
        sealed = self._aead.encrypt(nonce, plain, _CONTEXT)
        return base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, blob: str) -> str:
        """The thinking a blob holds; ValueError if it was not sealed here or was changed."""
        if len(blob) > MAX_BLOB_CHARS:
            raise ValueError("the encrypted reasoning is larger than any this service makes")
        try:
            raw = base64.urlsafe_b64decode(blob.encode())
            plain = self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], _CONTEXT)
            thinking = json.loads(plain)["thinking"]
        except (binascii.Error, ValueError, InvalidTag, KeyError, TypeError):
            raise ValueError(
                "encrypted_content was not made by this deployment, or was changed: send back "
                "the reasoning item as the response gave it, or leave it out"
            ) from None
        if not isinstance(thinking, str):
            raise ValueError("encrypted_content holds no reasoning text")
        return thinking
