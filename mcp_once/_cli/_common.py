"""What every command that opens a key store shares: the URL option and its failures."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

import anyio

from idempotency import KeyStore, StoreError, StoreUnavailable, open_store

#: The embedded durable default: a SQLite file in the working directory.
DEFAULT_STORE_URL = "sqlite:///.mcp-once/keys.sqlite3"
EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


def add_store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        default=os.environ.get("MCP_ONCE_STORE", DEFAULT_STORE_URL),
        help="key store URL: memory://, sqlite:///path.db, redis://host:port/db,"
        " redis+sentinel://host:port[,host:port...]/service_name[/db] or"
        " redis+cluster://host:port[,host:port...] (rediss+... for TLS); the query carries"
        " the store's options, e.g. redis://host:6379/0?prefix=app:&wait_replicas=1&wait_aof=true"
        " (default: $MCP_ONCE_STORE or %(default)s)",
    )


def fail(message: str, code: int) -> NoReturn:
    print(f"mcp-once: {message}", file=sys.stderr)
    raise SystemExit(code)


def redacted(url: str) -> str:
    """`url` without its password, for printing (a Redis URL may carry one)."""
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


def unreachable(url: str, exc: Exception) -> NoReturn:
    fail(f"the key store at {redacted(url)!r} cannot be reached: {exc}", EXIT_UNREACHABLE)


def open_or_fail(url: str) -> KeyStore:
    """The store at `url`, or an exit with a sentence saying what is wrong with the URL."""
    try:
        return open_store(url)
    except StoreUnavailable as exc:
        unreachable(url, exc)
    except (ValueError, TypeError) as exc:
        fail(f"bad key store URL: {str(exc).replace(url, redacted(url))}", EXIT_USAGE)


#: A key no record is ever stored under (store keys are SHA-256 hex digests): reading it proves
#: the store answers without touching any record.
PROBE_KEY = "mcp-once-startup-probe"
#: A store that has not answered by then is as good as unreachable for a command starting up.
PROBE_TIMEOUT = 10.0


async def store_problem(store: KeyStore, url: str) -> str | None:
    """Why the store cannot be used, or None when it answers. Asked once before a command starts,
    so a wrong URL is one clear sentence, not a hundred STORE_UNAVAILABLE answers later."""
    try:
        with anyio.fail_after(PROBE_TIMEOUT):
            await store.get(PROBE_KEY)
    except (StoreUnavailable, TimeoutError, OSError) as exc:
        return f"the key store at {redacted(url)!r} cannot be reached: {exc}"
    except StoreError as exc:
        return f"the key store at {redacted(url)!r} cannot be used: {exc}"
    return None
