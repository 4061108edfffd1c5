"""A separate OS process that opens its own SQLite journal, for the cross-process tests.

Usage: python _journal_child.py race PATH RUN HOLDER
    prints "ready" once the journal answers, acquires when a line arrives on stdin (the start
    barrier), then prints "won FENCE" or "busy".
Usage: python _journal_child.py record PATH RUN
    acquires RUN and records intents at positions 0, 1, 2, ... printing each position only
    after its record_intent returned, until killed.
"""

from __future__ import annotations

import sys

import anyio
import anyio.to_thread

from orchestrator import derive_key
from orchestrator._journal import Entry, RunBusy, SQLiteJournal, fingerprint_arguments


async def race(path: str, run_id: str, holder: str) -> None:
    journal = SQLiteJournal(path)
    try:
        await journal.run(run_id)  # open the file before the barrier, so the acquires collide
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        try:
            fence = await journal.acquire(run_id, holder, 60.0)
        except RunBusy:
            print("busy", flush=True)
        else:
            print(f"won {fence}", flush=True)
    finally:
        await journal.aclose()


async def record(path: str, run_id: str) -> None:
    journal = SQLiteJournal(path)
    fence = await journal.acquire(run_id, "writer", 60.0)
    position = 0
    while True:
        await journal.record_intent(
            run_id,
            fence,
            Entry(
                position=position,
                server="billing",
                tool="charge",
                fingerprint=fingerprint_arguments({"n": position}),
                key=derive_key("run", run_id, str(position)),
                state="intent",
                at=1_750_000_000.0,
            ),
        )
        print(position, flush=True)
        position += 1


if __name__ == "__main__":
    if sys.argv[1] == "race":
        anyio.run(race, *sys.argv[2:5])
    else:
        anyio.run(record, *sys.argv[2:4])
