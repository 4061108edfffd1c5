"""A process that claims unique keys in the SQLite store until it is killed, for the durability
test (`test_sqlite_group_commit.py`).

Usage: python _group_claimer.py PATH CALLERS asyncio|trio
CALLERS tasks claim `k0`, `k1`, ... in a closed loop; after each claim is answered the process
prints `acked KEY COMMITS TRANSITIONS` (the writer's counters at that moment) and flushes, so
every key on stdout was acknowledged to its caller. One caller exercises the direct path (each
transition commits alone), many the group-commit path.
"""

from __future__ import annotations

import itertools
import sys

import anyio

from idempotency import SQLiteKeyStore


async def main(path: str, callers: int) -> None:
    store = SQLiteKeyStore(path)
    numbers = itertools.count()
    writer = store._writer

    async def caller() -> None:
        while True:
            key = f"k{next(numbers)}"
            outcome = await store.claim(key, "fp", lease=600.0, takeover=False)
            assert outcome.token is not None, outcome
            print(f"acked {key} {writer.commits} {writer.transitions}", flush=True)

    async with anyio.create_task_group() as tg:
        for _ in range(callers):
            tg.start_soon(caller)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), backend=sys.argv[3])
