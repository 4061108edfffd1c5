"""The Redis store's side of rule 20: where the audit stream lives, and reading it back.

A record's history is one string beside it (`{prefix}{key}:h`, the record's own hash tag, so
the same slot); the scripts that decide write it (`scripts/lib.lua`, `record_event`). The audit
stream is a Redis Stream the same script appends to, so it must live in the record's slot too:

* one Redis (or a primary behind Sentinel): one stream, `{prefix}audit`;
* a Redis Cluster: one stream per hash slot, `{prefix}audit{T}` where T is a short tag that
  hashes to that slot (`slot_tag`): a script may only touch keys of its own slot, and a
  stream per slot, unlike one per node, stays right when slots migrate. Readers SCAN every
  master for them and merge by time.

Each stream is capped (`AUDIT_MAX_ENTRIES`, approximately: `MAXLEN ~`) by the script that
appends to it; `trim` drops entries older than a retention.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterable

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from ..history import AuditEntry, entry


@functools.cache
def _slot_tags() -> tuple[str, ...]:
    """A short tag per slot that hashes to it (built once, on a cluster's first audited call:
    some 150 000 CRC16s of a few bytes, in C)."""
    tags: list[str | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
    left = REDIS_CLUSTER_HASH_SLOTS
    n = 0
    while left:
        tag = format(n, "x")
        slot = key_slot(tag.encode())
        if tags[slot] is None:
            tags[slot] = tag
            left -= 1
        n += 1
    return tuple(t for t in tags if t is not None)


def slot_tag(rkey: bytes) -> str:
    """The tag of the stream in `rkey`'s slot."""
    return _slot_tags()[key_slot(rkey)]


def stream_key(prefix: bytes, rkey: bytes, cluster: bool) -> bytes:
    """The audit stream a script on `rkey` appends to."""
    if not cluster:
        return prefix + b"audit"
    return prefix + b"audit{" + slot_tag(rkey).encode() + b"}"


def entries(stream: Iterable[tuple[bytes, list[bytes]]]) -> list[tuple[int, int, AuditEntry]]:
    """XRANGE's reply as ((ms, seq), entry) pairs for merging."""
    found = []
    for id, fields in stream:
        values = dict(zip(fields[::2], fields[1::2], strict=True))
        ms, _, seq = id.decode().partition("-")
        found.append(
            (
                int(ms),
                int(seq),
                entry(
                    id.decode(),
                    values[b"k"].decode(errors="replace"),
                    values[b"t"].decode(errors="replace"),
                    values[b"e"].decode(errors="replace"),
                ),
            )
        )
    return found


def merged(streams: list[list[tuple[int, int, AuditEntry]]], limit: int) -> list[AuditEntry]:
    """Several streams' entries in time order, at most `limit`."""
    out = []
    for _ms, _seq, found in heapq.merge(*streams, key=lambda item: (item[0], item[1])):
        out.append(found)
        if len(out) >= limit:
            break
    return out
