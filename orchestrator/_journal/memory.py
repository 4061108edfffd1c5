"""`MemoryJournal`: one process, nothing durable. For tests and demos; the rules are the same
as every other journal's (`lease.py`, `entry.py`), so the contract suite holds it to them."""

from __future__ import annotations

import dataclasses
import time

from . import lease as rules
from .entry import Entry, check_intent, nothing_to_mark, recorded_before
from .journal import DEFAULT_RETENTION, Clock, RunSummary


class MemoryJournal:
    """Runs in dicts. Each method runs without awaiting in between, so it is atomic among the
    tasks of one event loop."""

    def __init__(self, *, clock: Clock = time.time, retention: float = DEFAULT_RETENTION) -> None:
        self._clock = clock
        self.retention = retention
        self._heads: dict[str, RunSummary] = {}
        self._entries: dict[str, dict[int, Entry]] = {}

    def __repr__(self) -> str:
        return "MemoryJournal()"

    async def acquire(
        self,
        run_id: str,
        holder: str,
        lease: float,
        *,
        alive: str | None = None,
        dead: int | None = None,
    ) -> int:
        rules.check_run_id(run_id)
        head = rules.acquired(
            self._heads.get(run_id),
            run_id,
            rules.check_holder(holder),
            rules.check_lease(lease),
            self._clock(),
            alive=alive,
            dead=dead,
        )
        self._heads[run_id] = head
        self._entries.setdefault(run_id, {})
        return head.fence

    async def renew(self, run_id: str, fence: int, lease: float) -> None:
        head = rules.held(self._heads.get(run_id), run_id, fence)
        self._heads[run_id] = rules.renewed(head, rules.check_lease(lease), self._clock())

    async def release(self, run_id: str, fence: int) -> bool:
        head = self._heads.get(run_id)
        if head is None or head.fence != fence or head.holder is None:
            return False
        self._heads[run_id] = rules.released(head, self._clock())
        return True

    async def entries(self, run_id: str) -> list[Entry]:
        found = self._entries.get(run_id, {})
        return [found[position] for position in sorted(found)]

    async def record_intent(self, run_id: str, fence: int, entry: Entry) -> None:
        check_intent(entry)
        head = rules.held(self._heads.get(run_id), run_id, fence, writing=True)
        entries = self._entries[run_id]
        if recorded_before(entries.get(entry.position), entry, run_id):
            return
        entries[entry.position] = entry
        self._heads[run_id] = dataclasses.replace(
            head, calls=head.calls + 1, dangling=head.dangling + 1, updated_at=self._clock()
        )

    async def mark_done(self, run_id: str, fence: int, position: int) -> None:
        head = rules.held(self._heads.get(run_id), run_id, fence, writing=True)
        entries = self._entries[run_id]
        existing = entries.get(position)
        if existing is None:
            raise nothing_to_mark(run_id, position)
        if existing.state == "done":
            return
        entries[position] = dataclasses.replace(existing, state="done")
        self._heads[run_id] = dataclasses.replace(
            head, dangling=head.dangling - 1, updated_at=self._clock()
        )

    async def finish(self, run_id: str, fence: int) -> None:
        head = rules.held(self._heads.get(run_id), run_id, fence)
        self._heads[run_id] = rules.finished(head, self._clock())

    async def run(self, run_id: str) -> RunSummary | None:
        return self._heads.get(run_id)

    async def runs(self) -> list[RunSummary]:
        return sorted(self._heads.values(), key=lambda head: (head.created_at, head.run_id))

    async def purge(self, run_id: str, *, force: bool = False) -> bool:
        head = self._heads.get(run_id)
        if head is None:
            return False
        rules.purgeable(head, self._clock(), force=force)
        del self._heads[run_id]
        self._entries.pop(run_id, None)
        return True

    async def sweep(self, now: float | None = None) -> int:
        cutoff = (self._clock() if now is None else now) - self.retention
        gone = [run_id for run_id, head in self._heads.items() if rules.swept(head, cutoff)]
        for run_id in gone:
            del self._heads[run_id]
            self._entries.pop(run_id, None)
        return len(gone)

    async def aclose(self) -> None:
        return None
