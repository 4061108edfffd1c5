"""Which record a `keys show`, `settle` or `history` addresses, and what to say when none is there.

A record is stored under a hash of (scope, tool, key), where the default scope holds the server's
name: from what a client saw (its key and the tool) the record is found only with the server's
name too. Servers sharing one store may each have a record for the same key and tool, so without
`--server` (or with a wrong one) nothing is guessed: each server the store's histories name
(rule 25: a claimed event names its server) gets its store key derived and looked for, and the
ones that hold a record are named, with their store keys. With a store key, `--server` is a
check: the record's history must name that server.
"""

from __future__ import annotations

import argparse
import re
import sys

from idempotency import (
    AuditedStore,
    CallScope,
    CorruptRecord,
    KeyStore,
    default_scope,
    history_servers,
    record_servers,
    store_key,
    wire,
)

from ._common import EXIT_PROBLEM, EXIT_USAGE, fail, redacted

#: Records are stored under a SHA-256 hex digest of (scope, tool, key): see `idempotency.store_key`.
_STORE_KEY = re.compile(r"[0-9a-f]{64}")


def store_key_of(args: argparse.Namespace) -> str | None:
    """The store key the arguments address; None for --client-key and --tool without --server
    (the action then names the servers that hold a record for them: `absent`)."""
    derived = (args.client_key, args.tool)
    if args.key and any(derived):
        fail("give either a store key or --client-key/--tool/--server, not both", EXIT_USAGE)
    if args.key:
        if not _STORE_KEY.fullmatch(args.key.lower()):
            fail(
                f"{args.key!r} is not a store key (64 hex digits, as `keys list` prints them);"
                " to find a record by the key the client sent, give --client-key, --tool and"
                " --server",
                EXIT_USAGE,
            )
        return str(args.key).lower()
    if not all(derived):
        fail(
            "give a store key, or --client-key and --tool (and --server; without it, the"
            " servers holding a record for them are named)",
            EXIT_USAGE,
        )
    problem = wire.key_problem(args.client_key)
    if problem is not None:
        fail(f"--client-key: {problem}", EXIT_USAGE)
    return None if args.server is None else _derived(args.server, args.tool, args.client_key)


def _derived(server: str, tool: str, client_key: str) -> str:
    """The store key of a client's key under the default scope without a principal."""
    scope = default_scope(
        CallScope(server=server, tool=tool, principal=None, meta=None, request=None)
    )
    return store_key(scope, tool, client_key)


async def _holders(store: KeyStore, tool: str, client_key: str) -> list[tuple[str, str, bool]]:
    """(server, store key, whether its record is live) of each server, among those the store's
    histories name, that holds a record or a history for the client's key and tool: a record's
    name is a hash, so each server's is derived and looked for."""
    if not isinstance(store, AuditedStore):
        return []
    names: set[str] = set()
    for _, text in await store.histories():
        try:
            names.update(history_servers(text))
        except ValueError:  # an unreadable history: `audit verify` names it
            continue
    found = []
    for name in sorted(names):
        key = _derived(name, tool, client_key)
        try:
            live = await store.get(key) is not None
        except CorruptRecord:
            live = True
        if live or await store.history(key):
            found.append((name, key, live))
    return found


async def absent(store: KeyStore, args: argparse.Namespace) -> int:
    """Exit 1 saying that no record is where the arguments point; for a key derived from what
    the client saw, which servers do hold one for that client key and tool."""
    where = f"in the key store at {redacted(args.store)!r}"
    if args.client_key is None:
        print(f"mcp-once: no live record for key {args.key} {where}", file=sys.stderr)
        return EXIT_PROBLEM
    if args.key is None:
        said = "give --server, the MCP server's own name"
    else:
        said = f"no live record for key {args.key} (server {args.server!r}) {where}"
    holders = await _holders(store, args.tool, args.client_key)
    asked = f"this --client-key and --tool {args.tool!r}"
    if not holders:
        print(f"mcp-once: {said}; no server holds a record for {asked} {where}", file=sys.stderr)
        return EXIT_PROBLEM
    held = "; ".join(
        f"server {name!r}: store key {key}{'' if live else ' (history only: the record is gone)'}"
        for name, key, live in holders
    )
    print(f"mcp-once: {said}; records for {asked}: {held}", file=sys.stderr)
    return EXIT_PROBLEM


async def addressed(store: KeyStore, args: argparse.Namespace) -> int | None:
    """None when the arguments address one record of the server meant; else the exit code,
    once said why: no --server (`absent`), or a store key whose history does not name the
    --server given."""
    if args.key is None:
        return await absent(store, args)
    if args.client_key is not None or args.server is None:
        return None
    named = await record_servers(store, args.key)
    if args.server in named:
        return None
    whose = f"names server {', '.join(map(repr, named))}" if named else "names no server"
    print(
        f"mcp-once: record {args.key} is not server {args.server!r}'s: its history {whose}"
        " (leave --server out to address it by its store key alone)",
        file=sys.stderr,
    )
    return EXIT_PROBLEM
