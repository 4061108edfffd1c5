"""The Lua scripts behind `RedisKeyStore`, read from package data once at import.

Each transition is one script so that it is one round trip and atomic: Redis runs a script to
the end before serving anyone else, which is what makes the token check a real compare-and-set
across processes and hosts. `lib.lua` (record layout, clock, decoding) is prepended to each.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    #: What EVALSHA is called with; Redis computes the same SHA-1 when it caches `source`.
    sha: str
    #: `EVALSHA <sha> 1` as bytes, the head of every call on one key: encoded once, not per call.
    evalsha: tuple[bytes, bytes, bytes]
    #: Records history events, or reads the in-doubt index: four more trailing arguments
    #: (lib.lua: index, said, audit, mac).
    audited: bool = False


def _load(name: str, *, audited: bool = False) -> Script:
    folder = resources.files(__package__ or "idempotency._stores.redis").joinpath("scripts")
    prelude = folder.joinpath("lib.lua").read_text(encoding="utf-8")
    body = folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    source = f"{prelude}\n{body}"
    sha = hashlib.sha1(source.encode()).hexdigest()
    return Script(name, source, sha, (b"EVALSHA", sha.encode(), b"1"), audited)


CLAIM = _load("claim", audited=True)
RENEW = _load("renew")
COMPLETE = _load("complete", audited=True)
RELEASE = _load("release", audited=True)
SETTLE = _load("settle", audited=True)
ABANDON = _load("abandon")
RECONCILE = _load("reconcile", audited=True)
LEAVE_UNKNOWN = _load("leave_unknown", audited=True)
READ = _load("read")
PURGE = _load("purge", audited=True)
IN_DOUBT = _load("in_doubt", audited=True)
INDEX = _load("index", audited=True)
FORGET = _load("forget")
HISTORY = _load("history")
MARK = _load("mark")
