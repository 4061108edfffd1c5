"""The run journal under `orchestrator.Run`: where each keyed call's intent is recorded before
it is sent and marked done after its answer, under a fenced lease (one writer per run), so a
killed and restarted agent resends its unfinished calls under the same keys instead of new ones.

- `entry.py`: `Entry` (one call at one position) and `fingerprint_arguments`;
- `journal.py`: the `Journal` protocol and `RunSummary`;
- `lease.py`: the lease and fence rules (acquire, renew, release, finish), and what a sweep
  forgets, as pure functions the memory and SQLite journals share;
- `memory.py`, `sqlite.py`, `redis.py` (+ `lua/`, one script per fenced write): the backends;
- `open.py`: `open_journal(url)`, and the default file under `.mcp-once/`;
- `errors.py`: `JournalError` and its kinds, `RunBusy` among them.
"""

from .entry import Entry, EntryState, fingerprint_arguments
from .errors import (
    EntryConflict,
    FencedOut,
    JournalError,
    JournalUnavailable,
    RunBusy,
    RunFinished,
)
from .journal import DEFAULT_LEASE, DEFAULT_RETENTION, Clock, Journal, RunState, RunSummary
from .memory import MemoryJournal
from .open import default_journal_path, open_journal
from .sqlite import SQLiteJournal

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_RETENTION",
    "Clock",
    "Entry",
    "EntryConflict",
    "EntryState",
    "FencedOut",
    "Journal",
    "JournalError",
    "JournalUnavailable",
    "MemoryJournal",
    "RunBusy",
    "RunFinished",
    "RunState",
    "RunSummary",
    "SQLiteJournal",
    "default_journal_path",
    "fingerprint_arguments",
    "open_journal",
]
