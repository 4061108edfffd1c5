"""The proxies on this machine: where their default stores live, and how an operator finds one.

Each `mcp-once proxy` keeps its default store in the user's state folder (`platformdirs`:
`$XDG_STATE_HOME/mcp-once`, `~/.local/state/mcp-once`, `~/Library/Application Support/mcp-once`,
`%LOCALAPPDATA%\\mcp-once`), never in the working directory: desktop clients start servers in `/`
or a read-only folder, and a store per working directory is a store nobody finds. One SQLite file
per upstream (`NAME-ID.sqlite3`), and beside it, written at every start, a manifest
(`NAME-ID.json`): the upstream's name and id, the server name its records are scoped by, its
store's URL (a password replaced by `***`), and its command line or URL for a person to read
(the names of its env variables and headers, never their values). A proxy on a store of its own
(`--store`) writes its manifest there too, so `mcp-once proxy --list` shows every proxy started on
this machine, and `keys ... --proxy NAME` / `audit ... --proxy NAME` find its store and server
without an operator typing either.

No FastMCP here: `keys` and `audit` use it without the `fastmcp` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from ._common import (
    DEFAULT_STORE_URL,
    EXIT_USAGE,
    STORE_VARIABLE,
    fail,
    from_environment,
    print_table,
)

#: The suffix of a proxy's manifest in the state folder.
MANIFEST_SUFFIX = ".json"


def state_folder() -> Path:
    """Where proxies keep their default stores and manifests (the platform's user state folder)."""
    return Path(platformdirs.user_state_dir("mcp-once", appauthor=False))


def default_store(stem: str) -> str:
    """The default store URL of the upstream whose file stem is `stem` (`identity.py`)."""
    return f"sqlite:///{state_folder() / stem}.sqlite3"


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a proxy writes about itself at start (see the module doc)."""

    name: str
    id: str
    server: str
    store: str
    upstream: str
    started_at: float
    #: The output schemas of the upstream's tools, by name, as last listed (tools without one
    #: left out): what `keys settle --proxy NAME` checks a settled result against.
    output_schemas: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.name}@{self.id}"


class StateFolderUnwritable(OSError):
    """The state folder cannot be made or written (a read-only home, a folder of another user)."""


def record(manifest: Manifest, stem: str) -> Path:
    """Write `manifest` as `<state folder>/<stem>.json`, atomically (a reader never sees half of
    it). Raises `StateFolderUnwritable` saying why the folder cannot be written."""
    folder = state_folder()
    path = folder / f"{stem}{MANIFEST_SUFFIX}"
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(asdict(manifest), indent=2) + "\n", encoding="utf-8")
        os.replace(partial, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise StateFolderUnwritable(exc.strerror or str(exc)) from exc
    return path


def manifests() -> list[Manifest]:
    """Every manifest in the state folder, most recently started first (unreadable ones left
    out: a manifest is a convenience, never the truth about a store)."""
    folder = state_folder()
    found: list[Manifest] = []
    for path in sorted(folder.glob(f"*{MANIFEST_SUFFIX}")) if folder.is_dir() else []:
        try:
            data: Any = json.loads(path.read_text(encoding="utf-8"))
            found.append(Manifest(**data))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(found, key=lambda m: m.started_at, reverse=True)


def find(wanted: str) -> Manifest:
    """The proxy named `wanted` (`NAME`, or `NAME@ID` where two upstreams share a name)."""
    every = manifests()
    matches = [m for m in every if wanted in (m.name, m.key)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(sorted({m.key for m in every})) or "none"
        fail(
            f"--proxy {wanted}: no proxy of that name has started on this machine (recorded in"
            f" {state_folder()}: {known}; `mcp-once proxy --list` shows them)",
            EXIT_USAGE,
        )
    fail(
        f"--proxy {wanted}: {len(matches)} upstreams have that name"
        f" ({', '.join(m.key for m in matches)}): give NAME@ID",
        EXIT_USAGE,
    )


def add_proxy_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--proxy",
        metavar="NAME",
        help="act on the records of the mcp-once proxy of this name (NAME or NAME@ID, as"
        " `mcp-once proxy --list` shows): its store (unless --store names another) and its"
        " server, as --server",
    )


def proxy_manifest(args: argparse.Namespace) -> Manifest | None:
    """The manifest of the proxy whose records `args` address: `--proxy NAME`'s, or that of the
    proxy whose server name `--server` gives; None for any other server's records."""
    wanted = getattr(args, "proxy", None)
    if wanted is not None:
        return find(wanted)
    server = getattr(args, "server", None)
    found = [m for m in manifests() if server is not None and m.server == server]
    return found[0] if len(found) == 1 else None


def apply_proxy(args: argparse.Namespace) -> None:
    """Fill `args.store` (unless `--store` names another than the default) and `args.server`
    from the manifest of `--proxy NAME`, if given: before the record's key is derived."""
    wanted = getattr(args, "proxy", None)
    if wanted is None:
        return
    found = find(wanted)
    server = getattr(args, "server", None)
    if server is not None and server != found.server:
        fail(
            f"--proxy {wanted} and --server {server!r} name two servers: --proxy's is"
            f" {found.server!r}; give one of them",
            EXIT_USAGE,
        )
    # Where the action takes --server, it is the proxy's: a record found by what the client saw
    # is derived under it, a store key is checked against it, a listing filtered by it.
    args.server = found.server
    if args.store == from_environment(STORE_VARIABLE, DEFAULT_STORE_URL):
        if "***" in found.store:
            fail(
                f"--proxy {wanted}: its store's URL carries a password, which is not recorded"
                f" ({found.store}): give --store with it",
                EXIT_USAGE,
            )
        args.store = found.store


def print_proxies() -> int:
    """`mcp-once proxy --list`: one line per proxy started on this machine."""
    every = manifests()
    if not every:
        print(f"mcp-once: no proxy has started on this machine (none in {state_folder()})")
        return 0
    rows = [
        [
            m.key,
            time.strftime("%Y-%m-%d %H:%M", time.localtime(m.started_at)),
            m.store,
            m.upstream,
        ]
        for m in every
    ]
    print_table(("PROXY", "STARTED", "STORE", "UPSTREAM"), rows)
    print(
        f"(state folder {state_folder()}; `keys ... --proxy NAME` acts on one; its records'"
        ' --server is "mcp-once proxy: NAME@ID")'
    )
    return 0
