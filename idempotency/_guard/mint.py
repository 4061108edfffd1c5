"""Which key a call runs under: the client's (validated) or one derived from the call itself."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import wire
from . import errors
from .fingerprint import canonical_json
from .keyplaces import META_PLACE, FoundKey

DERIVED_PREFIX = "derived-"


class KeySource(enum.StrEnum):
    CLIENT = "client"
    DERIVED = "derived"


#: The 2026-07-28 multi-round fields of a request (SEP-2322), by their wire names.
_ROUND_FIELDS = ("inputResponses", "requestState")


def input_round(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The input-round fields a request carries (answers to the server's questions and the
    state it handed out), or None for a first round. `params` are the raw request params."""
    if not isinstance(params, Mapping):
        return None
    found = {name: params[name] for name in _ROUND_FIELDS if params.get(name) is not None}
    return found or None


#: Request `_meta` entries that differ between two sends of one call by design, or are the
#: protocol's envelope rather than the caller's input: never part of a derived key. The SDK's
#: parsed request `_meta` spells the progress token `progress_token`; the wire `progressToken`.
_NOT_INPUT = frozenset({"progressToken", "progress_token", "traceparent", "tracestate", "baggage"})
_NOT_INPUT_PREFIXES = ("io.modelcontextprotocol/", wire.NAMESPACE)


def meta_inputs(meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The request `_meta` entries a tool may read as input (a user id, a locale, a version),
    or None. Two keyless calls that differ there are two calls, never merged; what a re-send
    changes by design (progress token, trace context) and the protocol's and mcp-once's own
    entries are left out, so a blind re-send still finds its first attempt."""
    if not isinstance(meta, Mapping):
        return None
    found = {
        name: value
        for name, value in meta.items()
        if name not in _NOT_INPUT and not name.startswith(_NOT_INPUT_PREFIXES)
    }
    return found or None


def derive_key(
    scope: str,
    tool: str,
    fingerprint: str,
    *,
    caller: str,
    round_fields: Mapping[str, Any] | None,
    meta: Mapping[str, Any] | None = None,
) -> str:
    """A key for a keyless call: the same call from the same caller in the same scope always gets
    the same key, so that caller's blind re-send finds the first attempt's record — and nobody
    else's call ever does (rule 7). A completing input round (`round`) is a call of its own: its
    stored answer never answers a first round, which asks the user afresh. So is a call whose
    request `_meta` carries other input (`meta_inputs`). Printable ASCII, 72 characters."""
    parts: list[Any] = ["derived", scope, caller, tool, fingerprint, round_fields]
    inputs = meta_inputs(meta)
    if inputs is not None:
        parts.append(inputs)  # appended only when present: keys without it are unchanged
    return DERIVED_PREFIX + hashlib.sha256(canonical_json(parts)).hexdigest()


def resolve_key(
    found: Sequence[FoundKey],
    mode: str,
    derive: Callable[[], str | None],
    *,
    elsewhere: tuple[str, ...] = (),
) -> tuple[str, KeySource] | None:
    """The key and its source, or None for a keyless call that runs unprotected: under
    "optional", or under "derived" when `derive` finds no caller to bind the key to.

    `found` are the keys the call carries (`keyplaces.found_keys`), `elsewhere` the places
    besides `_meta` the tool takes one from (named when a required key is missing). Raises the
    contract's invalid-params error for a malformed key in every mode and every place, for keys
    that disagree, and for a missing one under "required". Every key is checked before any is
    compared, so a malformed one is reported as such wherever it sits.
    """
    if not found:
        if mode == "required":
            raise errors.key_missing(elsewhere)
        if mode == "optional":
            return None
        derived = derive()
        return None if derived is None else (derived, KeySource.DERIVED)
    for each in found:
        problem = wire.key_problem(each.value)
        if problem is not None:
            place = None if each.place == META_PLACE else each.place
            raise errors.key_malformed(each.value, problem, place)
    first = found[0]
    for each in found[1:]:
        if each.value != first.value:
            raise errors.keys_disagree(first.place, each.place)
    assert isinstance(first.value, str)
    return first.value, KeySource.CLIENT


def attempt_of(meta: Mapping[str, Any] | None) -> int | None:
    """The client's informational attempt number, when it sent a sane one."""
    value = (meta or {}).get(wire.ATTEMPT_META)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return None
