"""What someone who can write the store, but holds no audit key, can do to a history (issue 48).

Text functions (`edited`, `recomputed`, `cut`, `unsealed`) change a history as stored; `Raw`
reads, writes and deletes histories and appends audit stream entries behind the store's back, on
memory, SQLite and Redis, as such a person would with `sqlite3` or `redis-cli`.
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
                return str(client.get(self._hkey(record)).decode())
        with sqlite3.connect(self.location) as conn:
            (text,) = conn.execute("SELECT lines FROM history WHERE key = ?", (record,)).fetchone()
            return str(text)

    def set(self, record: str, text: str) -> None:
        if isinstance(self.store, MemoryKeyStore):
            assert self.store._trail is not None
            self.store._trail.histories[record] = text
        elif self.location.startswith("redis"):
            with self._redis() as client:
                client.set(self._hkey(record), text, keepttl=True)
        else:
            with sqlite3.connect(self.location) as conn:
                conn.execute("UPDATE history SET lines = ? WHERE key = ?", (text, record))

    def delete(self, record: str) -> None:
        if isinstance(self.store, MemoryKeyStore):
            assert self.store._trail is not None
            del self.store._trail.histories[record]
        elif self.location.startswith("redis"):
            with self._redis() as client:
                assert client.delete(self._hkey(record)) == 1
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

    def _hkey(self, record: str) -> str:
        return f"{self.prefix}{{{record}}}:h"

    def _redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.location)
