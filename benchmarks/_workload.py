"""One workload for every contender: what a guarded tool call asks of its key store.

Each pair is the store work of one first execution: hash the call (fingerprint), name its
record (scoped, hashed key), claim it, store a result of `RESULT_BYTES` bytes. Every contender
does the same hashing and stores the same bytes, so the figures compare the stores themselves.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Final

from idempotency import CallScope, default_scope, fingerprint, store_key
from idempotency._stores.redis import lua
from idempotency._stores.redis.store import IN_DOUBT_INDEX

TOOL: Final = "charge"
SERVER: Final = "bench"
PREFIX: Final = "bench:"
#: The store's in-doubt index under that prefix, which its scripts keep.
INDEX: Final = PREFIX.encode() + IN_DOUBT_INDEX
#: A typical small tool result once encoded (a short text content block plus the envelope).
RESULT_BYTES: Final = 200
LEASE: Final = 30.0
RETENTION: Final = 3600.0
SCOPE: Final = default_scope(CallScope(SERVER, TOOL, None, None, None))


def arguments(n: int) -> dict[str, Any]:
    return {"order": f"order-{n}", "cents": 1999}


def result_bytes(size: int = RESULT_BYTES) -> bytes:
    """`size` bytes of JSON, like an encoded tool result."""
    head = b'{"content":"'
    tail = b'"}'
    return head + b"x" * max(0, size - len(head) - len(tail)) + tail


def powertools_result(size: int = RESULT_BYTES) -> dict[str, Any]:
    """A dict whose JSON (as Powertools serialises it) is `size` bytes, like `result_bytes`."""
    body = json.dumps({"content": ""}, sort_keys=True)
    return {"content": "x" * max(0, size - len(body))}


def call_names(run: str, n: int) -> tuple[str, str]:
    """(record key, fingerprint) of logical call `n`, as the server guard computes them."""
    args = arguments(n)
    return store_key(SCOPE, TOOL, f"{run}-{n}"), fingerprint(TOOL, args)


def pair_script_source() -> str:
    """claim.lua then complete.lua in ONE script: the server-side work of a claim+complete pair
    at the network cost of one request, for `redis-benchmark` (which cannot chain two commands).

    ARGV: offset, fingerprint, lease_us, takeover, token, retention_us, result, index, said,
    audit — the claim's first five (then '' for the tool name, as `store.claim` without `tool=`
    sends, and no re-send), the complete's retention and result, and the trailer every audited
    script reads at the end of its own ARGV (lib.lua: index, said, audit, mac): the in-doubt
    index both keep (`INDEX`), then '', '' and '' (no history).
    """
    prelude = lua.CLAIM.source.split("\n-- claim(KEYS[1]", 1)[0]
    claim_body = lua.CLAIM.source[len(prelude) :]
    complete_body = lua.COMPLETE.source[len(lua.COMPLETE.source.split("\n-- complete(", 1)[0]) :]
    if not claim_body.strip() or not complete_body.strip() or prelude == lua.CLAIM.source:
        raise RuntimeError("the store's scripts changed shape; update pair_script_source()")
    return (
        f"{prelude}\n"
        f"local function claim_step(KEYS, ARGV)\n{claim_body}\nend\n"
        f"local function complete_step(KEYS, ARGV)\n{complete_body}\nend\n"
        "local c = claim_step(KEYS, {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], '', '0', '0',"
        " ARGV[8], ARGV[9], ARGV[10], ''})\n"
        "if c[1] ~= 'claimed' then return c end\n"
        "return complete_step(KEYS,"
        " {ARGV[1], ARGV[5], ARGV[6], ARGV[7], '0', '0', ARGV[8], ARGV[9], ARGV[10], ''})\n"
    )


def new_token() -> str:
    return secrets.token_hex(16)
