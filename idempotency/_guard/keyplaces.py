"""Where a key may travel besides request `_meta`: a tool argument, an HTTP request header.

Most clients cannot write request `_meta` (a model only fills arguments; the MCP Inspector, most
agents and HTTP gateways never touch it), so a server may name an argument (`key_argument`) and a
header (`key_header`) a key is also taken from. A key is a key wherever it comes from: each one
found is validated exactly like a `_meta` key (`wire.key_problem`), and the error names the place.
Places that agree are one key; places that disagree are refused (-32602, rule 16), because the
server cannot know which of two logical calls the request is.

The argument path is dotted for nested objects (`"meta.idempotency-key"`, as commerce protocols'
MCP bindings carry it); a segment therefore never contains a dot. A JSON null where the key goes
is a malformed key, as in `_meta`: the listed schema says "string", and a silent "no key" would
run a call the client meant to protect.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import wire

#: What the listed schema tells a model about the key argument: the whole protocol in a sentence.
KEY_ARGUMENT_DESCRIPTION = (
    "Idempotency key: a new unique value (for example a UUID) for each action you intend, and"
    " the same value again when you retry that same action, so it is carried out only once."
    " Printable ASCII, 1 to 255 characters."
)

#: An HTTP field name (RFC 9110 `token`).
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")

#: How the `_meta` place is named in errors.
META_PLACE = f"params._meta[{wire.KEY_META!r}]"


def check_header_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"key_header must be a string, not {type(name).__name__}")
    if not _HEADER_NAME.match(name):
        raise ValueError(f"key_header must be an HTTP header name; got {name!r}")
    return name


def header_place(name: str) -> str:
    return f"HTTP header {name!r}"


def without_key(arguments: Mapping[str, Any], path: str) -> dict[str, Any]:
    """`arguments` without the key at `path` (a copy; the caller's mapping is untouched). An
    object on the way that only held the key is dropped too, so the rest reads as it would
    have without the key."""
    segments = wire.argument_path(path)
    if wire.argument_at(arguments, segments) is wire.ABSENT:
        return dict(arguments)
    copied: dict[str, Any] = dict(arguments)
    parents: list[dict[str, Any]] = [copied]
    node = copied
    for segment in segments[:-1]:
        child = dict(node[segment])
        node[segment] = child
        parents.append(child)
        node = child
    del node[segments[-1]]
    for depth in range(len(segments) - 1, 0, -1):
        if parents[depth]:
            break
        del parents[depth - 1][segments[depth - 1]]
    return copied


def _header_values(request: object, name: str) -> list[str]:
    """Every value of header `name` on the HTTP request behind the SDK's request context
    (`ServerRequestContext.request`, a Starlette request on streamable HTTP in both eras);
    none elsewhere (stdio, in-memory)."""
    http_request = getattr(request, "request", None) if request is not None else None
    headers = getattr(http_request, "headers", None)
    if headers is None:
        return []
    getlist = getattr(headers, "getlist", None)
    if callable(getlist):
        return [str(v) for v in getlist(name)]
    value = headers.get(name) if isinstance(headers, Mapping) else None
    return [] if value is None else [str(value)]


@dataclass(frozen=True, slots=True)
class FoundKey:
    """A key as one place carried it (not yet validated), and that place, named for errors."""

    place: str
    value: object


def found_keys(
    meta: Mapping[str, Any] | None,
    arguments: Mapping[str, Any] | None,
    request: object,
    *,
    key_argument: str | None,
    key_header: str | None,
) -> list[FoundKey]:
    """Every key the call carries, `_meta` first, then the argument, then the header."""
    found: list[FoundKey] = []
    if meta is not None and wire.KEY_META in meta:
        found.append(FoundKey(META_PLACE, meta[wire.KEY_META]))
    if key_argument is not None:
        value = wire.argument_at(arguments, wire.argument_path(key_argument))
        if value is not wire.ABSENT:
            found.append(FoundKey(wire.argument_place(key_argument), value))
    if key_header is not None:
        for value in _header_values(request, key_header):
            found.append(FoundKey(header_place(key_header), value))
    return found


def schema_with_key(schema: Mapping[str, Any], key_argument: str, required: bool) -> dict[str, Any]:
    """The tool's input schema with the key argument in it (a deep copy).

    What the author declared stays as written: an existing property keeps its type and gains only
    a description if it had none. An object on the path that the schema describes by reference
    (`$ref`) or without `properties` is left alone: the key is still honoured there, but the
    schema cannot be extended without rewriting the author's types. `required` (keys="required")
    lists each level of the path as required.
    """
    result = copy.deepcopy(dict(schema))
    segments = wire.argument_path(key_argument)
    node = result
    for depth, segment in enumerate(segments):
        properties = node.get("properties")
        if properties is None and node.get("type", "object") == "object" and "$ref" not in node:
            properties = node["properties"] = {}
        if not isinstance(properties, dict):
            return result
        if required:
            listed = node.setdefault("required", [])
            if isinstance(listed, list) and segment not in listed:
                listed.append(segment)
        last = depth == len(segments) - 1
        child = properties.get(segment)
        if child is None:
            child = properties[segment] = (
                {"type": "string", "minLength": 1, "maxLength": wire.MAX_KEY_LENGTH}
                if last
                else {"type": "object"}
            )
        if not isinstance(child, dict):
            return result
        if last:
            child.setdefault("description", KEY_ARGUMENT_DESCRIPTION)
        node = child
    return result


def declares_argument(schema: Mapping[str, Any] | None, key_argument: str) -> bool:
    """Whether the author's own input schema declares the key argument's top-level name, i.e.
    whether the tool's signature takes it (and so receives it)."""
    properties = (schema or {}).get("properties")
    top = wire.argument_path(key_argument)[0]
    return isinstance(properties, Mapping) and top in properties
