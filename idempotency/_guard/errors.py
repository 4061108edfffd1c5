"""The JSON-RPC errors of the contract's error table, built in one place.

Every error carries a sentence a human can act on in `message` and, in `data`, the `key` whenever
it is known (the client needs it to reconcile) plus the machine-readable extras of its row.
"""

from __future__ import annotations

import math
from typing import Any

from mcp import MCPError

from .. import wire


def _data(key: str | None, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {} if key is None else {"key": key}
    data.update(extra)
    return data


def in_progress(key: str, retry_after: float) -> MCPError:
    ms = max(1, math.ceil(retry_after * 1000))
    return MCPError(
        wire.IN_PROGRESS,
        f"Another attempt with this idempotency key is still running; retry after {ms} ms.",
        _data(key, retryAfterMs=ms),
    )


def key_reused(key: str) -> MCPError:
    return MCPError(
        wire.KEY_REUSED,
        "This idempotency key was already used with different arguments; send a new key for"
        " a new call (this is a bug in the caller, do not retry).",
        _data(key),
    )


def outcome_unknown(key: str, why: str) -> MCPError:
    return MCPError(
        wire.OUTCOME_UNKNOWN,
        f"The outcome of the call with this idempotency key is unknown: {why}."
        " Do not retry blindly; reconcile first.",
        _data(key),
    )


def store_unavailable(key: str | None) -> MCPError:
    return MCPError(
        wire.STORE_UNAVAILABLE,
        "The idempotency key store could not be reached, so the tool was not run."
        " Retry after a backoff.",
        _data(key),
    )


def key_missing(elsewhere: tuple[str, ...] = ()) -> MCPError:
    """`elsewhere`: the other places (an argument, a header) this tool takes a key from."""
    places = " or ".join((f"params._meta[{wire.KEY_META!r}]", *elsewhere))
    return MCPError(
        wire.INVALID_PARAMS,
        f"This tool requires an idempotency key in {places}.",
        {"reason": "missing"},
    )


def key_malformed(key: object, problem: str, place: str | None = None) -> MCPError:
    """`place`: where the key came from (`wire.malformed_key` says how it is named)."""
    message, data = wire.malformed_key(key, problem, place)
    return MCPError(wire.INVALID_PARAMS, message, data)


def keys_disagree(first: str, second: str) -> MCPError:
    """Two places carried different keys: which logical call this is cannot be known (rule 16).
    Neither key is echoed: the caller knows both, and a log line needs neither."""
    return MCPError(
        wire.INVALID_PARAMS,
        f"The idempotency key in {first} differs from the one in {second}; send one key, or"
        " the same key in both places. Nothing was run.",
        {"reason": "conflicting keys", "places": [first, second]},
    )


def unfingerprintable(key: str | None, problem: str) -> MCPError:
    return MCPError(
        wire.INVALID_PARAMS,
        f"The arguments cannot be fingerprinted for idempotency: {problem}.",
        _data(key, reason=problem),
    )


def corrupt_record(key: str) -> MCPError:
    return MCPError(
        wire.CORRUPT_RECORD,
        "The idempotency record for this key cannot be read (damaged, or written by something"
        " else); the tool was not run and the record was left untouched for an operator"
        " (`mcp-once keys list` shows it as corrupt). Do not retry.",
        _data(key),
    )
