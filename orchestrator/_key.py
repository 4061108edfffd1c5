"""Idempotency keys: one per logical call, minted here unless the caller brings its own.

The key is what lets a server recognise a retry as the same call, so it must be identical on
every attempt and unique across logical calls. A random 128-bit value is both, without any
coordination between clients.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from typing import Any

from idempotency import wire


def mint_key() -> str:
    """A fresh key: a random UUID, 36 printable ASCII characters (well within the 255 limit)."""
    return str(uuid.uuid4())


def resolve_key(idempotency_key: object, meta: Mapping[str, Any] | None) -> str:
    """The key for one logical call: the caller's (checked) or a new one.

    A caller may pass the key either as `idempotency_key=` or inside `meta` under the wire name;
    both at once must agree. A bad key is refused here, before anything is sent, with the same
    rule the server applies (`wire.key_problem`), so it can never cost an attempt.
    """
    from_meta = meta.get(wire.KEY_META) if meta is not None else None
    if meta is not None and wire.KEY_META in meta:
        problem = wire.key_problem(from_meta)
        if problem is not None:
            raise ValueError(f"meta[{wire.KEY_META!r}]: {problem}")
    if idempotency_key is not None:
        problem = wire.key_problem(idempotency_key)
        if problem is not None:
            raise ValueError(f"idempotency_key: {problem}")
        assert isinstance(idempotency_key, str)
        if from_meta is not None and from_meta != idempotency_key:
            raise ValueError(
                f"idempotency_key and meta[{wire.KEY_META!r}] disagree; pass the key once"
            )
        return idempotency_key
    if isinstance(from_meta, str):
        return from_meta
    return mint_key()


def derive_key(source: str, *parts: str) -> str:
    """A key fixed by the identity of a logical call, e.g. an agent run's id and a tool-call id.

    The same parts give the same key on every attempt, in every process and after a restart, so a
    framework that re-issues a call under the same tool-call id reuses its key (and a guarded
    server replays instead of running the tool again). Parts are hashed (SHA-256 of their JSON
    list, so no two part lists collide by concatenation), which keeps the key short, printable
    ASCII whatever the ids contain, and does not put raw ids on the wire. `source` names the
    integration and prefixes the key, for whoever reads a store.
    """
    digest = hashlib.sha256(json.dumps([source, *parts]).encode()).hexdigest()
    return f"{source}-{digest[:40]}"
