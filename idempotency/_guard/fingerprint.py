"""The fingerprint of a call: what "the same call" means when a key comes back.

SHA-256 of canonical JSON (sorted keys, no whitespace, UTF-8) of the tool name and the arguments
as the client sent them, so every process and every backend computes the same value, and a key
reused with other arguments is caught (rule 3) also after completion. Numbers compare by value,
as RFC 8785 writes them: an integral float is written as the integer it equals (`20.0` as `20`,
`-0.0` as `0`), since `20` and `20.0` are one JSON number and clients differ in which they send
(JavaScript never writes `20.0`; Python's `json` does). Integers stay exact (RFC 8785 would round
one beyond 2**53 to a double; two distinct 64-bit ids must never share a fingerprint).

Records written before numbers compared by value hold the fingerprint of the float as written
(`"duration":20.0`). `fingerprints` gives that one too, as `legacy`, whenever the call has an
integral float (else the two are the same bytes): the guard claims with the fingerprint by value
first and, only if the record holds another, with the legacy one, so such a record still replays
for a retry that sends the same arguments (`Guard._claim_loop`).

The author may narrow what counts (`fingerprint=`, as AWS Powertools' payload validation does):
a field that changes between two sends of one call by design (a timestamp, a trace id) would
otherwise turn a retry into KEY_REUSED (-32011) instead of a replay. `covered` applies that
choice; the key argument never counts, whatever it says.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from ..wire import argument_path
from .keyplaces import without_key

#: What `fingerprint=` takes: `{"include": [paths]}` (only those count), `{"exclude": [paths]}`
#: (all but those count), paths dotted for nested objects; or a function of the arguments (the
#: key argument already removed) returning the JSON value that stands for the call.
FingerprintOption = Mapping[str, Any] | Callable[[Mapping[str, Any]], Any]


class UnfingerprintableArguments(ValueError):
    """The arguments are not plain JSON (NaN, infinities, non-string keys, cycles)."""


#: `json.dumps` with these options builds a new `JSONEncoder` per call; one, built once, writes
#: the same bytes (an encoder keeps no state between `encode` calls, so it is shared freely).
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> bytes:
    """One byte string per JSON value, whoever serialises it."""
    return _CANONICAL.encode(value).encode("utf-8")


def check_option(option: object) -> FingerprintOption:
    """`option` if it is a valid `fingerprint=`; a `TypeError`/`ValueError` saying why not."""
    if callable(option):
        return option
    if not isinstance(option, Mapping) or len(option) != 1 or set(option) - {"include", "exclude"}:
        raise TypeError(
            'fingerprint must be {"include": [paths]}, {"exclude": [paths]} or a function of'
            f" the arguments; got {option!r}"
        )
    (paths,) = option.values()
    if isinstance(paths, str) or not isinstance(paths, list | tuple | set | frozenset):
        raise TypeError(f"fingerprint paths must be a list of argument paths, not {paths!r}")
    for path in paths:
        argument_path(path)
    return option


def _included(arguments: Mapping[str, Any], paths: list[str]) -> dict[str, Any]:
    """Only the values at `paths` (an absent path stays absent)."""
    kept: dict[str, Any] = {}
    for path in sorted(paths):
        *parents, leaf = argument_path(path)
        source: Any = arguments
        target = kept
        for part in parents:
            source = source.get(part) if isinstance(source, Mapping) else None
            target = target.setdefault(part, {})
        if isinstance(source, Mapping) and leaf in source:
            target[leaf] = source[leaf]
    return kept


def covered(
    arguments: Mapping[str, Any] | None,
    *,
    key_argument: str | None,
    option: FingerprintOption | None,
) -> Any:
    """What the fingerprint covers of `arguments`: without the key argument, then narrowed by
    `option`. None and the arguments themselves when neither is set (the fingerprint of a tool
    without these options is what it always was)."""
    # `type(...) is dict` first: the common case, without the ABC's Python-level isinstance.
    if type(arguments) is not dict and not isinstance(arguments, Mapping):
        return arguments
    if key_argument is not None:
        arguments = without_key(arguments, key_argument)
    if option is None:
        return arguments
    if callable(option):
        try:
            return option(arguments)
        except (TypeError, ValueError, KeyError) as exc:
            raise UnfingerprintableArguments(f"the fingerprint function failed: {exc!r}") from exc
    if "include" in option:
        return _included(arguments, list(option["include"]))
    for path in option["exclude"]:
        arguments = without_key(arguments, path)
    return arguments


def fingerprint(tool: str, arguments: Any) -> str:
    """Hex SHA-256 of the call, numbers by value. Absent and empty arguments are the same call;
    `arguments` is a mapping, or what a `fingerprint=` function made of them."""
    return fingerprints(tool, arguments)[0]


def fingerprints(tool: str, arguments: Any) -> tuple[str, str | None]:
    """The call's fingerprint (`fingerprint`) and, when the call has an integral float, its
    legacy one (the float as written, as records before numbers compared by value hold it);
    None when the two are the same.

    The hot path pays for the float check with a few substring searches of the bytes it encodes
    anyway: an integral float's `repr` always holds `.0` followed by no digit (`20.0`) or a
    positive exponent (`1e+16`: every float that large is integral), so bytes with neither hold
    none; only bytes with one (or a string that contains one) are walked, and encoded again if
    they held one."""
    value = (
        dict(arguments or {})
        if arguments is None or type(arguments) is dict or isinstance(arguments, Mapping)
        else arguments
    )
    try:
        data = canonical_json({"tool": tool, "arguments": value})
    except (TypeError, ValueError) as exc:
        raise UnfingerprintableArguments(str(exc)) from exc
    # One-byte searches first (memchr): most arguments hold neither "." nor "+".
    if (b"." in data and b".0" in data) or (b"+" in data and b"e+" in data):
        by_value = _integral_floats_as_ints(value)
        if by_value is not value:
            exact = canonical_json({"tool": tool, "arguments": by_value})
            return hashlib.sha256(exact).hexdigest(), hashlib.sha256(data).hexdigest()
    return hashlib.sha256(data).hexdigest(), None


#: Values the encoder writes as they are, skipped by the walk without a call.
_LEAVES = (str, int, bool, type(None))


def _integral_floats_as_ints(value: Any) -> Any:
    """`value` with every integral float replaced by the int it equals (the encoder then writes
    RFC 8785's form of it): `value` itself, the same object, when it has none, else a copy of
    the containers on the way to each (dicts, lists and tuples, subclasses included, as the
    encoder reads them)."""
    kind = type(value)
    if kind is float:
        return int(value) if value.is_integer() else value
    if kind is dict or (kind not in _LEAVES and isinstance(value, dict)):
        pairs: Any = value.items()
        make: Any = dict
    elif kind is list or kind is tuple or isinstance(value, list | tuple):
        pairs, make = enumerate(value), list
    elif isinstance(value, float):  # a subclass, written as a float
        return int(value) if value.is_integer() else value
    else:
        return value
    copied: Any = None
    for place, item in pairs:
        if type(item) in _LEAVES:
            continue
        found = _integral_floats_as_ints(item)
        if found is not item:
            if copied is None:
                copied = make(value)
            copied[place] = found
    return value if copied is None else copied
