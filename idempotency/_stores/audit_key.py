"""The audit key: what turns a history's hash chain into a MAC chain (issue 48).

Why a key: a plain hash chain (`history.digest`) catches an edit, but anyone who can write the
store can edit an event and recompute every digest after it, or cut the history short. With an
audit key every link is an HMAC, and a keyed seal at the head of the history names how many
events it holds and its newest digest (`history.py`), so an edit with a recomputed chain, a
truncation, or a seal dropped are caught by whoever verifies with the key, and cannot be forged
without it.

Why a key per record: on Redis the events are decided and written inside a Lua script, so the
script needs key material. Each script is given its record's own key (HMAC-SHA-256 of the audit
key and the record's store key), as the two padded blocks HMAC-SHA1 starts from, never the audit
key itself: Redis stores no key, but a script's arguments can be seen with MONITOR and in SLOWLOG,
and a record key seen there opens that one record's history, no other. The links are HMAC-SHA1
because `redis.sha1hex` is the one hash a script has; the memory and SQLite stores compute the
same in Python, so one checker reads every backend.

Where it comes from (`resolve`): `audit_key=` (the key itself) or `audit_key_file=` (a file
holding it) on the store, in code or in the store URL's query; else `$MCP_ONCE_AUDIT_KEY`, else
`$MCP_ONCE_AUDIT_KEY_FILE`. Read from the environment by the store itself, so a server and
`mcp-once audit verify` configured by the same environment use the same key.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
from dataclasses import dataclass, field
from pathlib import Path

#: The environment variables a store reads its audit key from when none is given.
KEY_VARIABLE = "MCP_ONCE_AUDIT_KEY"
KEY_FILE_VARIABLE = "MCP_ONCE_AUDIT_KEY_FILE"
#: Shorter keys are refused: every MAC in the store is a test of a guess at the key.
MIN_KEY_BYTES = 16
#: Hex digits of a MAC kept in a line, as of a plain digest (`history.DIGEST_CHARS`).
MAC_CHARS = 16
#: Hex digits of a key's id (written in seals, so a verifier can tell which key one needs).
ID_CHARS = 8
_BLOCK = 64  # SHA-1's block: the HMAC pads' size
_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))


class RecordMac:
    """One record's history key: the MACs of its links and its seal (HMAC-SHA1, as Python's
    `hmac` computes it, from the two padded blocks hashed once: a MAC then costs two hash
    copies, not the setup of a new HMAC)."""

    __slots__ = ("_inner", "_outer", "_pads", "key_id")

    def __init__(self, key_id: str, secret: bytes) -> None:
        #: The audit key's id (`AuditKey.id`).
        self.key_id = key_id
        block = secret.ljust(_BLOCK, b"\0")
        self._pads = block.translate(_IPAD) + block.translate(_OPAD)
        self._inner = hashlib.sha1(self._pads[:_BLOCK])
        self._outer = hashlib.sha1(self._pads[_BLOCK:])

    def __repr__(self) -> str:
        return f"RecordMac(key_id={self.key_id!r})"

    def link(self, prev: str, body: str) -> str:
        """The MAC an event carries instead of `history.digest(prev, body)`."""
        return self._mac(f"{prev}|{body}")

    def seal(self, fields: str) -> str:
        """The MAC of a seal's fields (`history.py`); "seal|" keeps it apart from any link."""
        return self._mac(f"seal|{fields}")

    def script_argument(self) -> bytes:
        """What a Redis script gets to compute the same MACs (`scripts/lib.lua`,
        `record_event`): the key XORed with HMAC's two pads, then the key's id."""
        return self._pads + self.key_id.encode()

    def _mac(self, text: str) -> str:
        inner = self._inner.copy()
        inner.update(text.encode())
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()[:MAC_CHARS]


@dataclass(frozen=True, slots=True)
class AuditKey:
    """An audit key (`resolve` makes one); its repr never shows it."""

    _secret: bytes = field(repr=False)
    #: Names the key in seals and messages without revealing it.
    id: str = field(init=False)

    def __post_init__(self) -> None:
        named = hmac.digest(self._secret, b"mcp-once audit key id", "sha256").hex()[:ID_CHARS]
        object.__setattr__(self, "id", named)

    def record(self, key: str) -> RecordMac:
        """The history key of the record stored under `key` (kept for the records used last)."""
        return _record_key(self, key)


@functools.lru_cache(maxsize=4096)
def _record_key(audit_key: AuditKey, key: str) -> RecordMac:
    secret = hmac.digest(audit_key._secret, b"mcp-once history|" + key.encode(), "sha256")
    return RecordMac(audit_key.id, secret)


def record_mac(key: AuditKey | None, record: str) -> RecordMac | None:
    """The history key of the record stored under `record`; None without an audit key."""
    return None if key is None else key.record(record)


def resolve(
    audit_key: str | bytes | AuditKey | None = None,
    audit_key_file: str | os.PathLike[str] | None = None,
) -> AuditKey | None:
    """The audit key a store was given, else the environment's, else None (plain digests).

    Raises `ValueError` (never quoting the key) for both given at once, a file that cannot be
    read, or a key shorter than `MIN_KEY_BYTES` once a file's trailing newline is stripped."""
    if audit_key is not None and audit_key_file is not None:
        raise ValueError("give the store one audit key: audit_key or audit_key_file, not both")
    if audit_key is None and audit_key_file is None:
        audit_key = os.environ.get(KEY_VARIABLE) or None
        audit_key_file = os.environ.get(KEY_FILE_VARIABLE) or None
        if audit_key is not None and audit_key_file is not None:
            raise ValueError(
                f"both ${KEY_VARIABLE} and ${KEY_FILE_VARIABLE} are set: set one audit key"
            )
        where = f"${KEY_VARIABLE}"
    else:
        where = "audit_key="
    if isinstance(audit_key, AuditKey):
        return audit_key
    if audit_key_file is not None:
        try:
            audit_key = Path(audit_key_file).read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise ValueError(f"cannot read the audit key file {audit_key_file}: {exc}") from None
        where = f"the file {audit_key_file}"
    if audit_key is None:
        return None
    secret = audit_key.encode() if isinstance(audit_key, str) else bytes(audit_key)
    if len(secret) < MIN_KEY_BYTES:
        raise ValueError(
            f"the audit key from {where} is shorter than {MIN_KEY_BYTES} bytes: make one with"
            " `openssl rand -hex 32`"
        )
    return AuditKey(secret)
