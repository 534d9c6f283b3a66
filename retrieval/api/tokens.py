"""Opaque per-user tokens: the list cursors and job ids the memory hands out.

A cursor is an AMU's store-wide position and a job id a row number of the store's ``jobs``
table; handed out as they are, their gaps would tell a user how much the others write. A token
seals the number for one user and one kind: a keyed permutation of the 64-bit number (a
four-round Feistel network whose round function is HMAC-SHA256 keyed by the store's secret, the
kind and the user), followed by a 64-bit HMAC tag of the result, as 32 hex digits. One user's
tokens look random and unrelated to each other; a token of another user, kind or store, or any
other string, fails its tag and is refused. The numbers themselves stay the store's.

The secret is 32 random bytes in the store's meta (:data:`SECRET_KEY`), made by the first
writer that opens the store. A read-only memory of a store that never had one makes a secret
for its own lifetime (its cursors are valid while it is open).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Any

from retrieval.memory.errors import StoreMismatch

SECRET_KEY = "token_secret"
CURSOR, JOB = "cursor", "job"
_TOKEN = re.compile(r"[0-9a-f]{32}")
_ROUNDS = 4
_HALF = 0xFFFFFFFF


def store_secret(store: Any) -> bytes:
    """The store's token secret, made now when a writer opens a store without one; when several
    writers open a new store at once, the first secret written is every writer's."""
    saved = store.meta(SECRET_KEY)
    if saved is None and not store.read_only:
        try:
            store.bind(SECRET_KEY, secrets.token_hex(32))
        except StoreMismatch:  # another writer's secret came first (its message holds both: not shown)
            pass
        saved = store.meta(SECRET_KEY)
    return bytes.fromhex(saved) if saved else secrets.token_bytes(32)


class Tokens:
    """Seal and open the tokens of one store."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _key(self, kind: str, user: str) -> bytes:
        return hmac.new(self._secret, f"{kind}\0{user}".encode(), hashlib.sha256).digest()

    @staticmethod
    def _round(key: bytes, number: int, half: int) -> int:
        digest = hmac.new(key, bytes([number]) + half.to_bytes(4, "big"), hashlib.sha256).digest()
        return int.from_bytes(digest[:4], "big")

    @staticmethod
    def _tag(key: bytes, sealed: bytes) -> bytes:
        return hmac.new(key, b"tag" + sealed, hashlib.sha256).digest()[:8]

    def seal(self, kind: str, user: str, number: int) -> str:
        """The token of ``number`` (0 to 2**64 - 1) for ``user``."""
        key = self._key(kind, user)
        left, right = number >> 32, number & _HALF
        for index in range(_ROUNDS):
            left, right = right, left ^ self._round(key, index, right)
        sealed = ((left << 32) | right).to_bytes(8, "big")
        return (sealed + self._tag(key, sealed)).hex()

    def open(self, kind: str, user: str, token: Any) -> int | None:
        """The number ``token`` seals for ``user``, or None when it is not one of theirs."""
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            return None
        raw = bytes.fromhex(token)
        key = self._key(kind, user)
        if not hmac.compare_digest(self._tag(key, raw[:8]), raw[8:]):
            return None
        value = int.from_bytes(raw[:8], "big")
        left, right = value >> 32, value & _HALF
        for index in reversed(range(_ROUNDS)):
            left, right = right ^ self._round(key, index, left), left
        return (left << 32) | right
