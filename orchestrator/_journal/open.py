"""`open_journal(url)`: one configuration string picks where runs are journalled, so the same
agent runs on `memory://` in a test, a SQLite file on one host and Redis across hosts."""

from __future__ import annotations

import time
from pathlib import Path

from .journal import DEFAULT_RETENTION, Clock, Journal
from .memory import MemoryJournal
from .sqlite import SQLiteJournal

#: Where the default journal lives, relative to the working directory.
DEFAULT_DIRECTORY = ".mcp-once"
DEFAULT_FILE = "journal.db"
#: Kept here, not taken from `redis.py`, so that reading a URL never imports the Redis client.
REDIS_SCHEMES = (
    "redis://",
    "rediss://",
    "unix://",
    "redis+cluster://",
    "rediss+cluster://",
    "redis+sentinel://",
)


def default_journal_path() -> Path:
    """`.mcp-once/journal.db` under the working directory (the directory is made when the
    journal is first opened)."""
    return Path.cwd() / DEFAULT_DIRECTORY / DEFAULT_FILE


def open_journal(
    url: str | None = None, *, clock: Clock | None = None, retention: float = DEFAULT_RETENTION
) -> Journal:
    """The journal `url` names, or the default SQLite file when it is None.

    `memory://` (one process, for tests), `sqlite:///relative.db` or `sqlite:////absolute.db`
    (durable, one host), `redis://`, `rediss://`, `unix://`, `redis+cluster://host:port[,...]`,
    `rediss+cluster://` and `redis+sentinel://host:port[,...]/service[/db]` (shared by hosts).
    `clock` replaces the wall clock (Redis: its server clock) for leases and retention.
    """
    wall: Clock = clock if clock is not None else time.time
    if url is None:
        return SQLiteJournal(default_journal_path(), clock=wall, retention=retention)
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"a journal URL must be a non-empty string, not {url!r}")
    if url.startswith("memory:"):
        if url not in ("memory://", "memory:"):
            raise ValueError(f"the memory journal takes no location or options: {url!r}")
        return MemoryJournal(clock=wall, retention=retention)
    if url.startswith("sqlite:"):
        return SQLiteJournal(sqlite_path(url), clock=wall, retention=retention)
    if url.startswith(REDIS_SCHEMES):
        # Imported here so that agents without Redis never load its client.
        from .redis import RedisJournal

        return RedisJournal.from_url(url, clock=clock, retention=retention)
    scheme = url.split("://", 1)[0] if "://" in url else url
    raise ValueError(
        f"unknown journal URL scheme {scheme!r} in {url!r}; use memory://, sqlite:///path.db,"
        " redis://, rediss://, unix://, redis+cluster:// or redis+sentinel://"
    )


def sqlite_path(url: str) -> str:
    """The file path in a `sqlite:///…` URL (three slashes, then the path as written)."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        raise ValueError(
            f"not an SQLite journal URL: {url!r}; expected sqlite:///relative/path.db"
            " or sqlite:////absolute/path.db"
        )
    path = url[len(prefix) :]
    if not path:
        raise ValueError(f"the SQLite journal URL {url!r} names no file")
    if "?" in path or "#" in path:
        raise ValueError(f"the SQLite journal URL {url!r} has a query or fragment; it takes none")
    return path
