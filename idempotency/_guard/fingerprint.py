"""The fingerprint of a call: what "the same call" means when a key comes back.

SHA-256 of canonical JSON (sorted keys, no whitespace, UTF-8) of the tool name and the arguments
exactly as the client sent them, so every process and every backend computes the same value, and
a key reused with other arguments is caught (rule 3) also after completion.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


class UnfingerprintableArguments(ValueError):
    """The arguments are not plain JSON (NaN, infinities, non-string keys, cycles)."""


def canonical_json(value: Any) -> bytes:
    """One byte string per JSON value, whoever serialises it."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def fingerprint(tool: str, arguments: Mapping[str, Any] | None) -> str:
    """Hex SHA-256 of the call. Absent and empty arguments are the same call."""
    try:
        data = canonical_json({"tool": tool, "arguments": dict(arguments or {})})
    except (TypeError, ValueError) as exc:
        raise UnfingerprintableArguments(str(exc)) from exc
    return hashlib.sha256(data).hexdigest()
