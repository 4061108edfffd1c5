"""One journal entry: a keyed call at a position of a run, and the argument fingerprint that
tells a resumed run whether position N is the same call as before.

Results are deliberately absent: the server replays them by key, so an entry stays small (the
target is at most 300 stored bytes) whatever the tool returns.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from idempotency import wire

from .errors import EntryConflict

EntryState = Literal["intent", "done"]
ENTRY_STATES: tuple[EntryState, ...] = ("intent", "done")

#: Hex characters kept of the SHA-256: 128 bits tell two argument sets apart as surely as the
#: whole digest for this purpose (a divergence check, not a security boundary), in half the bytes.
FINGERPRINT_HEX = 32


def fingerprint_arguments(arguments: Mapping[str, Any] | None) -> str:
    """A short hex digest of the canonical JSON of `arguments` (sorted keys, no whitespace,
    UTF-8; absent and empty are the same), identical in every process and on every run.

    The same canonical form as the server's fingerprint, so "the same arguments" means one thing
    on both sides. Not plain JSON (NaN, non-string keys, objects) is a `ValueError`: a call the
    journal cannot recognise on resume must not be journalled as if it could.
    """
    try:
        data = json.dumps(
            dict(arguments or {}),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        ).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"arguments are not plain JSON, so they cannot be fingerprinted: {exc}"
        ) from exc
    return hashlib.sha256(data).hexdigest()[:FINGERPRINT_HEX]


@dataclass(frozen=True)
class Entry:
    """The call at `position` of a run: where it went (`server`, `tool`), what it was asked
    (`fingerprint`), the `key` it was sent under, whether its answer came back (`state`), and
    `at`, the wall-clock time its intent was recorded (for the "older than the server keeps
    keys" check on resume). Checked on construction, so no backend ever stores a malformed one.
    """

    position: int
    server: str
    tool: str
    fingerprint: str
    key: str
    state: EntryState
    at: float

    def __post_init__(self) -> None:
        if isinstance(self.position, bool) or not isinstance(self.position, int):
            raise TypeError(f"position must be an int, not {type(self.position).__name__}")
        if self.position < 0:
            raise ValueError(f"position must be >= 0, not {self.position}")
        for name in ("server", "tool", "fingerprint", "key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, not {value!r}")
        problem = wire.key_problem(self.key)
        if problem is not None:
            raise ValueError(f"key: {problem}")
        if self.state not in ENTRY_STATES:
            raise ValueError(f"state must be 'intent' or 'done', not {self.state!r}")
        if (
            isinstance(self.at, bool)
            or not isinstance(self.at, int | float)
            or not math.isfinite(self.at)
        ):
            raise ValueError(f"at must be a finite time in seconds, not {self.at!r}")

    def same_call(self, other: Entry) -> bool:
        """Whether `other` is this call again: same position, server, tool, arguments and key
        (its state and time may differ: a resumed run records an intent already done)."""
        return (self.position, self.server, self.tool, self.fingerprint, self.key) == (
            other.position,
            other.server,
            other.tool,
            other.fingerprint,
            other.key,
        )


def check_intent(entry: Entry) -> None:
    """`record_intent` takes intents only: a call is marked done by `mark_done`, after its
    answer, never recorded as done before it was sent."""
    if not isinstance(entry, Entry):
        raise TypeError(f"record_intent takes an Entry, not {type(entry).__name__}")
    if entry.state != "intent":
        raise ValueError(f"record_intent records intents; this entry is {entry.state!r}")


def recorded_before(existing: Entry | None, entry: Entry, run_id: str) -> bool:
    """Whether recording `entry` finds its call already at its position (then nothing is
    written). Another call there is `EntryConflict`: an entry is never overwritten."""
    if existing is None:
        return False
    if existing.same_call(entry):
        return True
    raise EntryConflict(
        f"run {run_id!r} position {entry.position} holds {existing.server}/{existing.tool}"
        f" (fingerprint {existing.fingerprint}), not {entry.server}/{entry.tool}"
        f" (fingerprint {entry.fingerprint}); an entry is never overwritten"
    )


def nothing_to_mark(run_id: str, position: int) -> Exception:
    """`mark_done` on a position with no intent: a bug in the caller, refused."""
    return EntryConflict(f"run {run_id!r} has no intent at position {position} to mark done")
