"""What someone who can write the store, but holds no audit key, can do to a history (issue 48).

Text functions (`edited`, `recomputed`, `cut`, `unsealed`) change a history as stored; `Raw`
reads, writes and deletes histories and appends audit stream entries behind the store's back, on
memory, SQLite and Redis (where a history is inside its record: format 3), as such a person
would with `sqlite3` or `redis-cli`.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from idempotency import AuditKey, MemoryKeyStore
from idempotency._stores import history as chain


def events_of(text: str) -> list[str]:
    return chain.peel(text)[1].split("\n")


def seal_of(text: str) -> str | None:
    return chain.peel(text)[0]


def joined(seal: str | None, lines: list[str]) -> str:
    return "\n".join([seal, *lines] if seal is not None else lines)


def edited(text: str, index: int, old: str, new: str) -> str:
    """Event `index` with `old` replaced by `new` in its line (digests untouched)."""
    lines = events_of(text)
    assert old in lines[index], (old, lines[index])
    lines[index] = lines[index].replace(old, new, 1)
    return joined(seal_of(text), lines)


def recomputed(text: str, index: int, old: str, new: str, *, guess: AuditKey | None = None) -> str:
    """Event `index` edited, and every digest recomputed: with plain SHA-1, or with MACs under
    a `guess` at the key (its seal forged with that guess, naming the real key's id); the seal,
    if any, kept otherwise (its head no longer matches)."""
    lines = events_of(text)
    prev = ""
    for at in range(len(lines)):
        anchor, when, code, fence, attempt, info, _ = chain.split_line(lines[at])
        if at == index:
            info = info.replace(old, new, 1)
        prev = anchor if anchor is not None else prev
        body = f"{when}|{code}|{fence}|{attempt}|{info}"
        dig = chain.digest(prev, body) if guess is None else guess.record("?").link(prev, body)
        lines[at] = f"{'^' + anchor + '|' if anchor is not None else ''}{body}|{dig}"
        prev = dig
    seal = seal_of(text)
    if seal is not None and guess is not None:
        real = chain.read_seal(seal)
        forged = chain.sealed(guess.record("?"), real.count, real.adopted, prev)
        seal = f"#{real.key_id}|{forged.split('|', 1)[1]}"
    return joined(seal, lines)


def cut(text: str, *, newest: int = 0, oldest: int = 0) -> str:
    """The history without its `newest` last and `oldest` first events (the first kept then
    anchored, as a bounded history's is); its seal, if any, kept."""
    lines = events_of(text)
    kept = lines[oldest : len(lines) - newest]
    if oldest and not kept[0].startswith("^"):
        kept[0] = f"^{chain.split_line(lines[oldest - 1])[6]}|{kept[0]}"
    return joined(seal_of(text), kept)


def unsealed(text: str) -> str:
    """The history without its seal line."""
    return chain.peel(text)[1]


def record_parts(raw: bytes) -> tuple[bytes, bytes, bytes]:
    """A format-3 Redis record (`scripts/lib.lua`) as (everything before its history's length,
    its history, everything after: the result)."""
    assert raw[0] == 3, f"not a format-3 record: format {raw[0]}"
    at = 58
    at += 2 + int.from_bytes(raw[at : at + 2], "big")  # fingerprint
    at += 1 + raw[at]  # token
    at += 1 + raw[at]  # tool name
    size = int.from_bytes(raw[at : at + 4], "big")
    return raw[:at], raw[at + 4 : at + 4 + size], raw[at + 4 + size :]


def redis_history(raw: bytes) -> str:
    """The history inside a format-3 Redis record's bytes."""
    return record_parts(raw)[1].decode()


def with_redis_history(raw: bytes, text: str) -> bytes:
    """A format-3 Redis record's bytes with `text` as its history."""
    head, _, rest = record_parts(raw)
    written = text.encode()
    return head + len(written).to_bytes(4, "big") + written + rest


def without_redis_history(raw: bytes) -> bytes:
    """A format-3 Redis record's bytes rewritten as format 2 (1 without a tool): no history."""
    head, _, rest = record_parts(raw)
    at = 58
    at += 2 + int.from_bytes(raw[at : at + 2], "big")
    at += 1 + raw[at]
    if raw[at] == 0:  # no tool name: format 1, without the name's length byte
        return bytes([1]) + head[1:at] + rest
    return bytes([2]) + head[1:] + rest


@dataclass
class Raw:
    """A store's histories and audit stream, reached around the store."""

    store: Any
    #: SQLite: the file. Redis: the URL.
    location: str = ""
    #: Redis: the store's prefix.
    prefix: str = ""

    def get(self, record: str) -> str:
        if isinstance(self.store, MemoryKeyStore):
            assert self.store._trail is not None
            return self.store._trail.histories[record]
        if self.location.startswith("redis"):
            with self._redis() as client:
                return redis_history(client.get(self._rkey(record)))
        with sqlite3.connect(self.location) as conn:
            (text,) = conn.execute("SELECT lines FROM history WHERE key = ?", (record,)).fetchone()
            return str(text)

    def set(self, record: str, text: str) -> None:
        if isinstance(self.store, MemoryKeyStore):
            assert self.store._trail is not None
            self.store._trail.histories[record] = text
        elif self.location.startswith("redis"):
            with self._redis() as client:
                name = self._rkey(record)
                client.set(name, with_redis_history(client.get(name), text), keepttl=True)
        else:
            with sqlite3.connect(self.location) as conn:
                conn.execute("UPDATE history SET lines = ? WHERE key = ?", (text, record))

    def delete(self, record: str) -> None:
        if isinstance(self.store, MemoryKeyStore):
            assert self.store._trail is not None
            del self.store._trail.histories[record]
        elif self.location.startswith("redis"):
            with self._redis() as client:  # the record rewritten without its history
                name = self._rkey(record)
                client.set(name, without_redis_history(client.get(name)), keepttl=True)
        else:
            with sqlite3.connect(self.location) as conn:
                conn.execute("DELETE FROM history WHERE key = ?", (record,))

    def forge_stream(self, record: str, tool: str, line: str, at: float) -> None:
        """Append an entry to the audit stream, as the store would for an event."""
        if isinstance(self.store, MemoryKeyStore):
            trail = self.store._trail
            assert trail is not None
            trail.stream.append((10**9, at, record, tool, line))
        elif self.location.startswith("redis"):
            with self._redis() as client:
                packed = f"{line}\n{chr(len(tool))}{tool}{record}"
                client.xadd(f"{self.prefix}audit", {"a": packed})
        else:
            with sqlite3.connect(self.location) as conn:
                conn.execute(
                    "INSERT INTO audit (at, key, tool, line) VALUES (?,?,?,?)",
                    (at, record, tool, line),
                )

    def _rkey(self, record: str) -> str:
        return f"{self.prefix}{{{record}}}"

    def _redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.location)
