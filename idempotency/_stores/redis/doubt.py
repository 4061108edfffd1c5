"""Writes whose outcome is unknown: sent, then the reply was lost and a re-send failed too.

Why: the guard retries a result it could not store (rule 11), and a client retries a claim that
ended in STORE_UNAVAILABLE. If the first attempt did land, a plain retry would misread its own
effect: a complete would answer "lost" (someone else's record, the result discarded as stale),
and a claim would find the key busy until its own orphaned lease ran out and then turn it
UNKNOWN. So the store remembers, per record, the claim token or the write that is in doubt, and
the next attempt at it is sent as a re-send (`store.py` explains what a re-send accepts).
Bounded: past `LIMIT` entries the oldest is forgotten, which only loses that convenience.
"""

from __future__ import annotations

from typing import Final

LIMIT: Final = 4096


class Doubts:
    """What this store sent and never learned the outcome of, oldest first."""

    def __init__(self) -> None:
        #: (record, what) -> token. Public so that the hot path can test it for emptiness
        #: without a call (nearly always empty).
        self.entries: dict[tuple[bytes, str], str] = {}

    def note(self, record: bytes, what: str, token: str) -> None:
        """`what` ("claim", "complete", "release") of `record` with `token` may have happened."""
        entries = self.entries
        entries.pop((record, what), None)
        entries[(record, what)] = token
        if len(entries) > LIMIT:
            del entries[next(iter(entries))]

    def take(self, record: bytes, what: str) -> str | None:
        """The token of a doubtful `what` of `record`, forgotten as it is returned."""
        return self.entries.pop((record, what), None)

    def holds(self, record: bytes, what: str, token: str) -> bool:
        return self.entries.get((record, what)) == token

    def settle(self, record: bytes, what: str, token: str) -> None:
        """The write's outcome is known now."""
        if self.entries.get((record, what)) == token:
            del self.entries[(record, what)]
