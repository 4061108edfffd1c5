"""One new SQLite file opened by several connections at once, again and again: what two agents,
two proxies or a server and `mcp-once audit --follow` do when they start together on a fresh
store or journal. Each connection is its own thread (SQLite locks connections in one process
against each other as it does processes). The files live in tmpfs where there is one, so that
the many schema commits cost no fsync."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

_TMPFS = Path("/dev/shm")


def failures_opening_together(
    open_one: Callable[[Path], None], *, rounds: int = 250, width: int = 4
) -> list[str]:
    """What `open_one(path)` raised, each time `width` threads ran it on one new file at once."""
    failed: list[str] = []

    def run(path: Path, start: threading.Barrier) -> None:
        start.wait()
        try:
            open_one(path)
        except Exception as exc:
            failed.append(f"{type(exc).__name__}: {exc}")

    where = str(_TMPFS) if _TMPFS.is_dir() else None
    with tempfile.TemporaryDirectory(dir=where) as directory:
        for round_ in range(rounds):
            path, start = Path(directory) / f"{round_}.db", threading.Barrier(width)
            threads = [threading.Thread(target=run, args=(path, start)) for _ in range(width)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    return failed
