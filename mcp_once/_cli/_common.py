"""What every command that opens a key store shares: the URL option and its failures.

Three rules hold for every command. Help shows where a default comes from, never its value: an
environment variable may hold a URL with a password, and `--help` is pasted into bug reports.
A plain path is taken as an SQLite store only with an SQLite file's extension, so a URL whose
scheme was forgotten (`127.0.0.1:6379`) is an error, not a new file of that name. And looking
creates nothing: a command that only reads refuses an SQLite file that does not exist (exit 3,
naming it) rather than making an empty store and reporting "no records"; only commands that
write, and servers, create one. Nor is an empty answer an all-clear: a command that only reads
(`reading`) refuses a store that holds nothing of mcp-once's, no mark and no record (another
Redis database, another `?prefix=`, an empty SQLite file), with exit 3 and the question "is this
the right --store?", rather than report "(0 records)" or "every chain holds" about the wrong
place.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import urlsplit, urlunsplit

import anyio

if TYPE_CHECKING:
    from idempotency import KeyStore

#: The embedded durable default: a SQLite file in the working directory.
DEFAULT_STORE_URL = "sqlite:///.mcp-once/keys.sqlite3"
EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
#: The environment variable `--store` defaults to.
STORE_VARIABLE = "MCP_ONCE_STORE"
#: The extensions a plain path given as a store may have (else: sqlite:///path).
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def from_environment(variable: str, fallback: str) -> str:
    """An option's default: `$variable` when set and not empty, else `fallback`. Read when the
    parser is built, and never shown in help (see the module doc)."""
    return os.environ.get(variable) or fallback


def add_store_option(parser: argparse.ArgumentParser, *, fallback: str | None = None) -> None:
    """`--store URL`, defaulting to `$MCP_ONCE_STORE`, else `DEFAULT_STORE_URL`; or, where the
    command's default is not one URL (the proxy's: a file per upstream), else None, with
    `fallback` saying in the help what it is."""
    default = (
        from_environment(STORE_VARIABLE, DEFAULT_STORE_URL)
        if fallback is None
        else os.environ.get(STORE_VARIABLE) or None
    )
    parser.add_argument(
        "--store",
        default=default,
        help="key store URL: memory://, sqlite:///path.db, redis://host:port/db,"
        " redis+sentinel://host:port[,host:port...]/service_name[/db] or"
        " redis+cluster://host:port[,host:port...] (rediss+... for TLS); the query carries"
        " the store's options, e.g. redis://host:6379/0?prefix=app:&wait_replicas=1&wait_aof=true"
        f" (default: ${STORE_VARIABLE} if set, else {fallback or DEFAULT_STORE_URL})",
    )


def fail(message: str, code: int) -> NoReturn:
    print(f"mcp-once: {message}", file=sys.stderr)
    raise SystemExit(code)


def redacted(url: str) -> str:
    """`url` without its password or audit key, for printing (a Redis URL may carry one, and
    any store URL an `audit_key=`)."""
    url = _AUDIT_KEY_OPTION.sub(r"\1***", url)
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))


_AUDIT_KEY_OPTION = re.compile(r"([?&]audit_key=)[^&#]*")


def unreachable(url: str, exc: Exception) -> NoReturn:
    fail(f"the key store at {redacted(url)!r} cannot be reached: {exc}", EXIT_UNREACHABLE)


def require_file(what: str, url: str, path: Path, *, made_by: str, also: str = "") -> None:
    """Exit 3 naming `path` when the SQLite file a command only reads does not exist, instead
    of letting SQLite create an empty one (see the module doc); `made_by` says what creates it,
    `also` where else to look."""
    if not path.is_file():
        fail(
            f"the {what} at {redacted(url)!r} cannot be reached: no {what} file at {path} (it"
            f" does not exist; looking creates nothing: {made_by} creates it){also}",
            EXIT_UNREACHABLE,
        )


def open_store(url: str) -> KeyStore:
    """`idempotency.open_store`, imported when a store is opened, not with this module:
    `mcp-once proxy` reads its command line with this module and starts its upstream's child
    before anything opens a store (issue 46)."""
    from idempotency import open_store as opened

    return opened(url)


def open_or_fail(url: str, *, existing: bool = False) -> KeyStore:
    """The store at `url`, or an exit with a sentence saying what is wrong with the URL.
    `existing`: the command only reads, so an SQLite file must exist already."""
    from idempotency import SQLiteKeyStore, StoreUnavailable

    plain_path = "://" not in url and not url.startswith(("memory:", "sqlite:"))
    if plain_path and url.strip() and not url.endswith(SQLITE_SUFFIXES):
        fail(
            f"bad key store URL: {redacted(url)!r} is neither a URL (memory://, sqlite:///,"
            f" redis://, ...) nor the path of an SQLite file ({', '.join(SQLITE_SUFFIXES)})",
            EXIT_USAGE,
        )
    try:
        store = open_store(url)
    except StoreUnavailable as exc:
        unreachable(url, exc)
    except (ValueError, TypeError) as exc:
        fail(f"bad key store URL: {str(exc).replace(url, redacted(url))}", EXIT_USAGE)
    if existing and isinstance(store, SQLiteKeyStore):
        require_file(
            "key store",
            url,
            store.path,
            made_by="a guarded server",
            also="; an mcp-once proxy keeps its own: `mcp-once proxy --list` shows them, and"
            " `--proxy NAME` reads one",
        )
    return store


#: A key no record is ever stored under (store keys are SHA-256 hex digests): reading it proves
#: the store answers without touching any record.
PROBE_KEY = "mcp-once-startup-probe"
#: A store that has not answered by then is as good as unreachable for a command starting up.
PROBE_TIMEOUT = 10.0


async def store_problem(store: KeyStore, url: str) -> str | None:
    """Why the store cannot be used, or None when it answers. Asked once before a command starts,
    so a wrong URL is one clear sentence, not a hundred STORE_UNAVAILABLE answers later."""
    from idempotency import StoreError, StoreUnavailable

    try:
        with anyio.fail_after(PROBE_TIMEOUT):
            await store.get(PROBE_KEY)
    except (StoreUnavailable, TimeoutError, OSError) as exc:
        return f"the key store at {redacted(url)!r} cannot be reached: {exc}"
    except StoreError as exc:
        return f"the key store at {redacted(url)!r} cannot be used: {exc}"
    return None


def server_cell(name: str | None) -> str:
    """A server's name in a table or a line: "-" when it cannot be read, in JSON quotes when it
    is empty or holds a blank (a proxy is "mcp-once proxy: NAME"), so columns stay columns."""
    if name is None:
        return "-"
    return json.dumps(name) if not name or any(c.isspace() for c in name) else name


#: A command's work on an open store: its exit code.
Action = Callable[["KeyStore", argparse.Namespace], Awaitable[int]]


async def nothing_here(store: KeyStore, url: str) -> str | None:
    """Why `store` is not worth reading, or None: it holds nothing of mcp-once's (no mark, no
    record, no history), so an empty answer from it would say nothing about the store the
    operator meant. A store that cannot say (one of one's own, not a `MarkedStore`) is read."""
    from idempotency import MarkedStore, MemoryKeyStore, SQLiteKeyStore

    if not isinstance(store, MarkedStore):
        return None
    if await store.mark() is not None or await store.holds_anything():
        return None
    from idempotency import RedisKeyStore  # redis-py: here only when a command fails

    if isinstance(store, SQLiteKeyStore):
        where = f" (file {store.path})"
    elif isinstance(store, MemoryKeyStore):
        where = " (a memory store lives and dies with one process: this command's is empty)"
    elif isinstance(store, RedisKeyStore):
        where = f" (prefix {store.prefix!r})"
    else:
        where = ""
    return f"nothing of mcp-once's at {redacted(url)!r}{where}: is this the right --store?"


def reading(action: Action) -> Action:
    """`action`, a command that only reads, run only on a store that holds something of
    mcp-once's; on any other, exit 3 saying so (see the module doc)."""

    async def run(store: KeyStore, args: argparse.Namespace) -> int:
        problem = await nothing_here(store, args.store)
        if problem is not None:
            print(f"mcp-once: {problem}", file=sys.stderr)
            return EXIT_UNREACHABLE
        return await action(store, args)

    return run


def print_table(columns: tuple[str, ...], rows: list[list[str]]) -> None:
    """Aligned columns under their names, one row a line, no trailing blanks: readable, and
    `awk '{print $1}'` still gets the first column."""
    lines = [list(columns), *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    for line in lines:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
