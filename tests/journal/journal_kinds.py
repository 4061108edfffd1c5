"""The journals under test and what the tests need to reach around them: the fake clock each
one reads, and a second journal over the same data (what another process would open)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fake_clock import FakeClock

from orchestrator import derive_key
from orchestrator._journal import (
    Entry,
    Journal,
    MemoryJournal,
    SQLiteJournal,
    fingerprint_arguments,
)

#: Retention of every journal under test: one hour.
RETENTION = 3600.0


@dataclass
class Kind:
    name: str
    journal: Journal
    clock: FakeClock
    _reopen: Callable[[], Journal] | None = None
    location: str = ""
    _extra: list[Journal] = field(default_factory=list)

    def reopen(self) -> Journal | None:
        """Another journal over the same runs, or None for the memory journal (one object)."""
        if self._reopen is None:
            return None
        other = self._reopen()
        self._extra.append(other)
        return other

    async def close(self) -> None:
        for journal in [*self._extra, self.journal]:
            await journal.aclose()


def make_memory() -> Kind:
    clock = FakeClock()
    return Kind("memory", MemoryJournal(clock=clock, retention=RETENTION), clock)


def make_sqlite(path: Path) -> Kind:
    clock = FakeClock()

    def open_it() -> Journal:
        return SQLiteJournal(path, clock=clock, retention=RETENTION)

    return Kind("sqlite", open_it(), clock, open_it, location=str(path))


def make_redis(url: str, namespace: str) -> Kind:
    from orchestrator._journal.redis import RedisJournal

    clock = FakeClock()
    prefix = f"{namespace}:journal:"

    def open_it() -> Journal:
        return RedisJournal.from_url(url, prefix=prefix, clock=clock, retention=RETENTION)

    return Kind("redis", open_it(), clock, open_it, location=prefix)


def entry(
    position: int,
    *,
    run_id: str = "run-1",
    server: str = "billing",
    tool: str = "send_invoice",
    arguments: dict[str, object] | None = None,
    at: float = 0.0,
) -> Entry:
    """A realistic intent: the key as a Run would derive it from (run id, position)."""
    return Entry(
        position=position,
        server=server,
        tool=tool,
        fingerprint=fingerprint_arguments(
            arguments if arguments is not None else {"customer": "c-42", "amount": 100 + position}
        ),
        key=derive_key("run", run_id, str(position)),
        state="intent",
        at=at or 1_750_000_000.0 + position,
    )
