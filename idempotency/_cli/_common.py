"""What every command that opens a key store shares: the URL option and its failures."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from .._open import open_store
from .._store import KeyStore, StoreUnavailable

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
        help="key store URL: memory://, sqlite:///path.db or redis://host:port/db"
        " (default: $MCP_ONCE_STORE or %(default)s)",
    )


def fail(message: str, code: int) -> NoReturn:
    print(f"mcp-once: {message}", file=sys.stderr)
    raise SystemExit(code)


def open_or_fail(url: str) -> KeyStore:
    """The store at `url`, or an exit with a sentence saying what is wrong with the URL."""
    try:
        return open_store(url)
    except StoreUnavailable as exc:
        fail(f"the key store at {url!r} cannot be reached: {exc}", EXIT_UNREACHABLE)
    except (ValueError, TypeError) as exc:
        fail(f"bad key store URL: {exc}", EXIT_USAGE)
