"""Who an upstream is (rule 22): the name an operator knows it by, and the identity behind it.

A record belongs to one server. Behind the proxy that server is the upstream, and the upstream is
not one word of its command line: two desktop entries running `npx -y server-memory` with two
memory files, or `mcp-server-git` on two repositories, are two servers. So an upstream is named
(`--name`, else its config entry's name, else a word of its command or URL) and identified by a
digest of how it is started: its command, arguments, working directory and configured `env` (the
values hashed), or its URL and headers (hashed). Name and digest give one short `id`, and the id
scopes everything the proxy keeps: the server name its records are scoped by
(`mcp-once proxy: NAME@ID`), its default store file and its manifest. Two upstreams that differ in
any of these never share a record, even on one store; replicas of one upstream (same command,
same folder, same env, or the same URL) share them.

The working directory is the one the child runs in (the entry's `cwd`, else the proxy's own), as
an absolute, resolved path: the same entry started by the same desktop client (from `/`, say) is
the same upstream every time, and relative paths in its arguments mean what they meant before.

The launch digest (without the name) also finds loops: a proxy marks its child's environment with
the chain of upstreams it is serving (`CHAIN_VARIABLE`), and a proxy whose upstream is already in
the chain it was started in would start itself again. Nothing here stores or logs an env value.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: Bumped if the derivation ever changes, so that two derivations never give one id.
_VERSION = "mcp-once-upstream/1"
#: The server name of the proxy's records starts with this (the rest is `NAME@ID`).
SERVER_PREFIX = "mcp-once proxy: "
#: Hex digits of the short id: 48 bits, unique among the upstreams of one machine or store.
ID_LENGTH = 12
#: The longest name an upstream may be given.
NAME_MAX = 80
#: The environment variable each proxy marks its stdio child with: the upstreams (name and launch
#: digest) of the proxies it was started under, outermost first, as a JSON list of pairs.
CHAIN_VARIABLE = "MCP_ONCE_PROXY_CHAIN"


class LoopError(ValueError):
    """The proxy's upstream would start this same proxy again (directly or through a chain)."""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def check_name(name: str) -> str:
    """`name` as an upstream's name, or ValueError saying why not (it is shown in listings and
    typed in `--proxy NAME`: printable, one line, not empty, at most `NAME_MAX` characters)."""
    if not name.strip():
        raise ValueError("an upstream's name must not be empty")
    if len(name) > NAME_MAX:
        raise ValueError(f"an upstream's name is at most {NAME_MAX} characters, not {len(name)}")
    if not name.isprintable():
        raise ValueError(f"an upstream's name is printable text on one line, not {name!r}")
    return name


def slug(text: str) -> str:
    """`text` as a file-name-safe word (letters, digits, `.`, `_`, `-`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:NAME_MAX] or "upstream"


def hashed(value: str) -> str:
    """SHA-256 of `value`, hex: how an env value or a header enters a launch digest."""
    return _sha256(value)


def launch_digest(launch: Mapping[str, object]) -> str:
    """SHA-256 of how an upstream is started or reached (values already hashed, `spec.py`)."""
    return _sha256(_canonical([_VERSION, launch]))


@dataclass(frozen=True, slots=True)
class UpstreamIdentity:
    """An upstream's name and launch digest, and what the proxy derives from them."""

    name: str
    launch: str

    @property
    def id(self) -> str:
        """The short id of name and launch together (in the server name, file names, listings)."""
        return _sha256(_canonical([_VERSION, self.name, self.launch]))[:ID_LENGTH]

    @property
    def key(self) -> str:
        """`NAME@ID`: what `mcp-once proxy --list` shows and `--proxy` takes."""
        return f"{self.name}@{self.id}"

    @property
    def server(self) -> str:
        """The server name the proxy's records are scoped by (`keys ... --server` takes it)."""
        return SERVER_PREFIX + self.key

    @property
    def stem(self) -> str:
        """The file name (without extension) of its default store and manifest."""
        return f"{slug(self.name)}-{self.id}"


def _chain(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The chain a proxy was started in (empty when it was not started by a proxy)."""
    text = environ.get(CHAIN_VARIABLE)
    if not text:
        return []
    try:
        found = json.loads(text)
    except ValueError:
        return []
    if not isinstance(found, list):
        return []
    pairs = [pair for pair in found if isinstance(pair, list) and len(pair) == 2]
    return [(str(name), str(launch)) for name, launch in pairs]


def check_chain(identity: UpstreamIdentity, environ: Mapping[str, str] | None = None) -> None:
    """Raise `LoopError` when `identity`'s upstream is already served by a proxy above this one
    (the chain in the environment this proxy was started with)."""
    chain = _chain(os.environ if environ is None else environ)
    launches = [launch for _, launch in chain]
    if identity.launch in launches:
        names = [name for name, _ in chain[launches.index(identity.launch) :]]
        raise LoopError(loop_message([*names, identity.name]))


def loop_message(names: list[str]) -> str:
    """The sentence a proxy stops with when its upstreams `names` (outermost first) come back to
    the first: it would start itself without end."""
    return (
        f"proxy loop: {' -> '.join(repr(n) for n in names)}: the upstream's command runs"
        " mcp-once proxy in front of that same upstream, which would start one proxy after"
        " another without end; point the entry at the real server's command instead"
    )


def chain_marking(identity: UpstreamIdentity, environ: Mapping[str, str] | None = None) -> str:
    """The value of `CHAIN_VARIABLE` for this proxy's child: its own chain plus its upstream."""
    chain = _chain(os.environ if environ is None else environ)
    return _canonical([list(pair) for pair in [*chain, (identity.name, identity.launch)]])
