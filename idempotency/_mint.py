"""Which key a call runs under: the client's (validated) or one derived from the call itself."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from . import _errors, wire
from ._fingerprint import canonical_json

DERIVED_PREFIX = "derived-"


class KeySource(enum.StrEnum):
    CLIENT = "client"
    DERIVED = "derived"


def derive_key(scope: str, tool: str, fingerprint: str) -> str:
    """A key for a keyless call: the same call in the same scope always gets the same key, so a
    blind re-send finds the first attempt's record. Printable ASCII, 72 characters."""
    digest = hashlib.sha256(canonical_json(["derived", scope, tool, fingerprint])).hexdigest()
    return DERIVED_PREFIX + digest


def resolve_key(
    meta: Mapping[str, Any] | None, mode: str, derive: Callable[[], str]
) -> tuple[str, KeySource] | None:
    """The key and its source, or None for a keyless call under "optional".

    Raises the contract's invalid-params error for a malformed key in every mode, and for a
    missing one under "required".
    """
    if meta is None or wire.KEY_META not in meta:
        if mode == "required":
            raise _errors.key_missing()
        if mode == "optional":
            return None
        return derive(), KeySource.DERIVED
    key = meta[wire.KEY_META]
    problem = wire.key_problem(key)
    if problem is not None:
        raise _errors.key_malformed(key, problem)
    assert isinstance(key, str)
    return key, KeySource.CLIENT


def attempt_of(meta: Mapping[str, Any] | None) -> int | None:
    """The client's informational attempt number, when it sent a sane one."""
    value = (meta or {}).get(wire.ATTEMPT_META)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return None
