"""The Redis store's audit trail (rules 20 and 24), read back.

A record's history is inside the record (format 3, `scripts/lib.lua`), written by the script that
decides with the same `SET` as the record; a record an earlier release wrote may have one beside
it (`{prefix}{key}:h`, the record's own hash tag, so the same slot), read until it moves in. With
`audit_stream=true`, on one Redis (or a primary behind Sentinel), the same script also appends
the event to the audit stream, `{prefix}audit`, capped at `AUDIT_MAX_ENTRIES` (approximately:
`MAXLEN ~`); `entries` reads it.

Without the stream (the default), and always on a Redis Cluster, the histories are the audit
trail: reading it merges every history's events by time (`from_histories`). A cluster keeps no
stream: a stream shared by the records of a slot is a key their scripts would touch without
declaring it, and a slot migration moves keys one batch at a time, so a script could append to a
stream already moved (a second stream, and a slot that cannot be handed over). A replay or
refusal repeating the last line updates it in place (`history.append`) rather than adding an
entry, so between two reads several of them show as one update carrying their count.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from ..history import AuditEntry, entry, parse


def entries(stream: Iterable[tuple[bytes, list[bytes]]]) -> list[AuditEntry]:
    """XRANGE's reply as audit entries, in the stream's order."""
    found = []
    for id, fields in stream:
        values = dict(zip(fields[::2], fields[1::2], strict=True))
        key, tool, line = _fields(values)
        found.append(
            entry(
                id.decode(),
                key.decode(errors="replace"),
                tool.decode(errors="replace"),
                line.decode(errors="replace"),
            )
        )
    return found


def _fields(values: dict[bytes, bytes]) -> tuple[bytes, bytes, bytes]:
    """(record key, tool, line) of one stream entry. Written as one field `a` (fewer for XADD to
    encode: `scripts/lib.lua`): the line, a newline, the tool name's length as one byte, the
    name, then the key (a line never holds a newline; a key or a name may). Entries written
    before that have three fields, `k`, `t` and `e`, and read the same."""
    packed = values.get(b"a")
    if packed is None:
        return values[b"k"], values[b"t"], values[b"e"]
    line, _, rest = packed.partition(b"\n")
    size = rest[0] if rest else 0
    return rest[1 + size :], rest[1 : 1 + size], line


def from_histories(
    histories: Iterable[tuple[str, str | None, str]], since: float | None, limit: int
) -> list[AuditEntry]:
    """Every event of (record key, tool, history), merged by when it was written, from `since`
    on. An entry's id is `KEY:DIGEST`: an event keeps its digest when older lines are dropped
    (its position moves up), and a replay or refusal updating its line in place gets a new one,
    so a follower (`mcp-once audit --follow`) prints the update as SQLite's table and one
    Redis's stream do, and each event once however the history was trimmed meanwhile."""
    runs = [
        [
            AuditEntry(f"{key}:{event.digest}", key, tool, event)
            for event in parse(text)
            if since is None or event.written >= since
        ]
        for key, tool, text in histories
    ]
    merged = heapq.merge(*runs, key=lambda found: (found.event.written, found.key))
    return [found for _, found in zip(range(limit), merged, strict=False)]
