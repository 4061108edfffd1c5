"""A store's own options written in its URL's query (`redis://host/0?wait_replicas=1`).

Why: a URL is the one configuration string a deployment passes (`--store`, `$MCP_ONCE_STORE`,
`open_store`), so every option of a store's `from_url` must be writable there too, or the
durability advice (`wait_replicas`, `wait_aof`) could not be followed from the command line.

`take_options` removes the options a store owns from the query and parses each with its type;
the rest of the URL is returned as written (percent-encoding and order kept), for the backend's
own parser (redis-py's, for a Redis URL). Parsing is strict where redis-py's is lenient: a
boolean is one of true/false/1/0/yes/no/on/off (redis-py reads `wait_aof=flase` as true), a
number must be finite, an option given twice or with no value is an error naming it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote_plus

#: Parses one query value (already percent-decoded); raises `ValueError` saying what it wants.
Parser = Callable[[str], Any]

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("expected an integer") from None


def number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


def number_or_none(text: str) -> float | None:
    """A number of seconds, or `none` for no limit."""
    if text.lower() == "none":
        return None
    try:
        return number(text)
    except ValueError:
        raise ValueError("expected a number or none") from None


def boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("expected true or false")


def string(text: str) -> str:
    return text


def take_options(
    url: str, parsers: Mapping[str, Parser], keywords: Mapping[str, Any]
) -> tuple[str, dict[str, Any]]:
    """(`url` without the options `parsers` names, every one of those options: its value in the
    URL, parsed, else its value in `keywords` (the caller's keyword arguments)).

    Raises `ValueError` naming the option for a value its parser refuses, an empty value, or an
    option given twice."""
    defaults = {name: keywords[name] for name in parsers}
    rest, qmark, query = url.partition("?")
    if not qmark:
        return url, defaults
    query, hash_, fragment = query.partition("#")
    kept: list[str] = []
    taken: dict[str, Any] = {}
    for piece in query.split("&"):
        raw_name, _, raw_value = piece.partition("=")
        name = unquote_plus(raw_name)
        parser = parsers.get(name)
        if parser is None:
            if piece:
                kept.append(piece)
            continue
        value = unquote_plus(raw_value)
        if name in taken:
            raise ValueError(f"the key store URL option {name!r} is given twice")
        if not value:
            raise ValueError(f"the key store URL option {name!r} has no value")
        try:
            taken[name] = parser(value)
        except ValueError as exc:
            raise ValueError(
                f"bad value for the key store URL option {name}={value!r}: {exc}"
            ) from None
    query = "&".join(kept)
    return f"{rest}{'?' if query else ''}{query}{hash_}{fragment}", defaults | taken


_UNEXPECTED = re.compile(r"got an unexpected keyword argument '([^']+)'")


def refused_option(exc: TypeError, url: str) -> str | None:
    """The query option of `url` that a constructor refused with `exc` ("got an unexpected
    keyword argument"), or None when `exc` is about something else (a keyword the caller passed
    in code, a real type error): redis-py stays the judge of which options it accepts."""
    found = _UNEXPECTED.search(str(exc))
    if found is None:
        return None
    _, _, query = url.partition("?")
    names = {unquote_plus(piece.partition("=")[0]) for piece in query.split("#")[0].split("&")}
    return found.group(1) if found.group(1) in names else None
