"""Stored results: domain form in, domain form out, and the replay marker on the way back.
(The envelope around a stored result, readable without the SDK, is `envelope.py`'s.)

A record holds the tool's `CallToolResult` as content, structuredContent, isError and the author's
own `_meta` — never a protocol-version envelope (`resultType`, the `serverInfo` stamp, per-version
field sieving): those are added by the SDK on the way out for whichever era the *reader* speaks,
so a record written for a 2025-11-25 client replays to a 2026-07-28 client and back (rule 6).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mcp_types import CallToolResult, TextContent
from pydantic import ValidationError
from pydantic_core import to_json

from .. import wire
from .envelope import FORMAT, UnreadableResult, open_envelope, rfc3339

#: Writes stored payloads: built once rather than per `json.dumps` call (same bytes).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
#: What every stored payload starts with, up to the number `executedAt` holds.
_HEAD = ('{"format":' + _ENCODER.encode(FORMAT) + ',"executedAt":').encode()
#: The envelope fields a record never keeps (`domain_form`), by their Python names.
_ENVELOPE = {"result_type"}
#: A stored payload's field saying its result is the replay of the server the tool called.
_UPSTREAM_REPLAYED = "upstreamReplayed"


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A stored result as `decode_result` reads it back."""

    result: CallToolResult
    #: Seconds since the epoch; None for payloads written by hand (an operator's settle).
    executed_at: float | None
    #: The result is a replay the tool passed on from the server it called (`origin`): its
    #: effect happened in an earlier call there, at `executed_at`.
    upstream_replayed: bool = False


def origin(result: CallToolResult) -> tuple[float, bool]:
    """When the effect of a result the tool just returned happened, and whether the result is a
    replay of the server the tool got it from (an mcp-once-guarded upstream behind the proxy):
    `(now, False)`, or for such a replay `(its executedAt, True)` (now when its marker does not say
    it readably). The replay marker is the upstream's own, left in the result's `_meta`; the
    guard's stamp replaces it on the way out, so without this the caller would read "executed"
    for an effect that happened in an earlier call (rule 18). MCP defines no other server's
    replay marker to look for."""
    meta = result.meta
    if meta:
        marker = meta.get(wire.IDEMPOTENCY_META)
        if isinstance(marker, dict) and marker.get("status") == "replayed":
            at = _parsed_time(marker.get("executedAt"))
            return (time.time() if at is None else at), True
    return time.time(), False


def _parsed_time(text: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 time with its offset (`rfc3339`'s form); None for
    anything else."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()


def domain_form(result: CallToolResult) -> dict[str, Any]:
    """The result as plain JSON, without envelope fields and without our own marker: what a
    record keeps, and what `mcp-once keys show --reveal-result` prints."""
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    dumped.pop("resultType", None)
    meta = dumped.get("_meta")
    if isinstance(meta, dict):
        meta.pop(wire.IDEMPOTENCY_META, None)
        if not meta:
            del dumped["_meta"]
    return dumped


def encode_result(
    result: CallToolResult, executed_at: float, *, upstream_replayed: bool = False
) -> bytes:
    """Bytes for `KeyStore.complete` / `KeyStore.settle` (`executed_at`: seconds since the
    epoch, replayed as the marker's `executedAt`; `upstream_replayed`: the result is the replay
    of the server the tool called, kept as `upstreamReplayed: true` beside it).

    The common case (a finite time, no marker of ours in the result's `_meta` to drop) is
    written by pydantic-core in one call, a third of the cost of dumping to Python and encoding
    that: the same JSON value, and the same bytes except for how some floats inside the result
    are spelt (`1e-7`, not `1e-07`; `0.00001`, not `1e-05`), which every JSON reader, ours
    included, reads as the same number. Fingerprints are never written this way: their bytes
    are the contract (`fingerprint.canonical_json`)."""
    meta = result.meta
    # No marker of ours to drop, nothing to keep beside the result.
    plain = not upstream_replayed and (not meta or wire.IDEMPOTENCY_META not in meta)
    if plain and type(executed_at) is float and math.isfinite(executed_at):
        body = to_json(result, by_alias=True, exclude_none=True, exclude=_ENVELOPE)
        return b"".join((_HEAD, repr(executed_at).encode(), b',"result":', body, b"}"))
    payload: dict[str, Any] = {"format": FORMAT, "executedAt": executed_at}
    if upstream_replayed:
        payload[_UPSTREAM_REPLAYED] = True
    payload["result"] = domain_form(result)
    return _ENCODER.encode(payload).encode("utf-8")


def decode_result(data: bytes) -> StoredResult:
    """The stored result, or `UnreadableResult` saying why not."""
    payload, executed_at = open_envelope(data)
    try:
        result = CallToolResult.model_validate(payload.get("result"))
    except ValidationError as exc:
        raise UnreadableResult(f"not a CallToolResult ({exc.error_count()} problems)") from None
    upstream = payload.get(_UPSTREAM_REPLAYED) is True
    return StoredResult(result, executed_at, upstream)


def stamped(
    result: CallToolResult,
    *,
    key: str,
    key_source: str,
    status: str,
    executed_at: float,
    attempts: int,
    stored: bool = True,
    reconciled: bool = False,
    upstream: bool = False,
) -> CallToolResult:
    """`result` with the contract's marker in its `_meta`; the author's entries are kept.

    `stored=False` (an executed result the guard could not store, rule 11) adds `stored: false`:
    the caller holds the only copy, and a retry will get OUTCOME_UNKNOWN (or, for a tool that may
    run twice, run it again) instead of a replay. `reconciled=True` (with status "replayed")
    adds `reconciled: true`: the answer is what a reconciler said the lost execution produced.
    `upstream=True` (with status "replayed") adds `upstream: true`: the result is the replay of
    the server the tool called (rule 18: an upstream's replay is never reported as executed).
    """
    marker: dict[str, object] = {
        "key": key,
        "keySource": key_source,
        "status": status,
        "executedAt": rfc3339(executed_at),
        "attempts": attempts,
    }
    if not stored:
        marker["stored"] = False
    if reconciled:  # answered from what the system of record said happened (rule 19)
        marker[wire.MARKER_RECONCILED] = True
    if upstream:  # the upstream replayed it: no effect came of this call (rule 18)
        marker[wire.MARKER_UPSTREAM] = True
    meta = {**(result.meta or {}), wire.IDEMPOTENCY_META: marker}
    return result.model_copy(update={"meta": meta})


def too_large_placeholder(size: int, limit: int) -> CallToolResult:
    """What replays get when the first result could not be kept: the effect happened once and
    will not happen again, which a retry must learn rather than run the tool a second time."""
    text = (
        f"The tool ran, but its result ({size} bytes) is larger than the {limit} bytes the"
        " idempotency store keeps, so it cannot be replayed. The tool will not run again for this"
        " idempotency key."
    )
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
