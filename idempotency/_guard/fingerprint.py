"""The fingerprint of a call: what "the same call" means when a key comes back.

SHA-256 of canonical JSON (sorted keys, no whitespace, UTF-8) of the tool name and the arguments
exactly as the client sent them, so every process and every backend computes the same value, and
a key reused with other arguments is caught (rule 3) also after completion.

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
    """Hex SHA-256 of the call. Absent and empty arguments are the same call; `arguments` is a
    mapping, or what a `fingerprint=` function made of them."""
    value = (
        dict(arguments or {})
        if arguments is None or type(arguments) is dict or isinstance(arguments, Mapping)
        else arguments
    )
    try:
        data = canonical_json({"tool": tool, "arguments": value})
    except (TypeError, ValueError) as exc:
        raise UnfingerprintableArguments(str(exc)) from exc
    return hashlib.sha256(data).hexdigest()
