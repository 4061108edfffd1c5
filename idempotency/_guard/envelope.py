"""A stored result's envelope: our format marker and the execution time around the result.

Read without the SDK, so that operator tooling can tell a readable record from a damaged one
without importing it (`mcp-once keys list` starts in a fraction of a second): `replay.py`
opens the envelope here and then validates the result with the SDK's `CallToolResult`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

#: Written into every stored payload; a reader refuses payloads of another format.
FORMAT = "mcp-once/result@1"


class UnreadableResult(ValueError):
    """A stored payload is not one of ours (damaged, foreign, or a newer format): raised by
    `decode_result`, with the reason as its message. The server answers CORRUPT_RECORD for it."""


def open_envelope(data: bytes) -> tuple[dict[str, Any], float | None]:
    """The payload (its `result` as JSON, not yet validated) and its execution time, or
    `UnreadableResult` saying why not."""
    try:
        payload = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnreadableResult(f"not JSON: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise UnreadableResult(f"not a {FORMAT} payload")
    executed_at = payload.get("executedAt")
    if executed_at is not None and (
        isinstance(executed_at, bool) or not isinstance(executed_at, int | float)
    ):
        raise UnreadableResult("executedAt is not a number")
    return payload, None if executed_at is None else float(executed_at)


def check_result_envelope(data: bytes) -> None:
    """Raise `UnreadableResult` when a stored payload is not one of ours: not JSON, another
    format, an `executedAt` that is not a number, or no result object in it.

    What damage and foreign writers leave, found without the SDK (`mcp-once keys list`). It
    does not validate the result against the SDK's `CallToolResult`, which only
    `decode_result` (and the server replaying it) can: a result our own code wrote always is
    one, and one written by a newer SDK may hold what this one's model does not know."""
    payload, _ = open_envelope(data)
    if not isinstance(payload.get("result"), dict):
        raise UnreadableResult("no result object in the payload")


def rfc3339(timestamp: float) -> str:
    """UTC, millisecond precision, `Z` suffix: what `executedAt` carries on the wire, and how
    `mcp-once keys` prints a record's times (`timestamp`: seconds since the epoch)."""
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
