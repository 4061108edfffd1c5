"""Checking a history, and the audit stream against the histories (`mcp-once audit verify`,
`mcp-once keys history`): what a chain proves with the audit key and without it.

Without a key a history is a plain hash chain (`history.digest`): a changed byte breaks it, and
so does an event removed or moved in the middle. But anyone who can write the store can recompute
every digest after an edit, or cut the newest events off, and the chain holds again. With the key
(`audit_key.py`) every link is a MAC and the seal pins the count of events and the newest digest,
so an edit with a recomputed chain, a truncation and a removed seal are caught as well. A history
the key's writers never sealed can prove only what a plain chain proves, and a verifier holding
the key says so (`unsealed`) rather than vouch for it: a chain recomputed without the key and its
seal dropped looks just like one written before the key was configured.

The audit stream (where one is kept) is a second copy of every event, written in the same
operation. A history dies with its record (rule 24), so a history that is gone while its record is
still stored and the stream holds its events was deleted; a history missing the newest event the
stream holds for it was cut short or rewritten (`compare_stream`).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from .audit_key import KEY_VARIABLE, AuditKey, RecordMac
from .history import (
    COUNTED,
    KINDS,
    AuditEntry,
    Event,
    parse,
    peel,
    read_seal,
    split_line,
)
from .history import digest as plain_digest

#: ok: the chain holds (and with a key, its MACs and seal). broken: it does not (named).
#: unsealed: with a key, events written without it, checked only as a plain chain. unchecked:
#: sealed with an audit key, and none was given.
Status = Literal["ok", "broken", "unsealed", "unchecked"]


@dataclass(frozen=True, slots=True)
class HistoryCheck:
    """What `check` found in one history."""

    status: Status
    #: What is wrong, naming the event where it can; None when the status is ok.
    problem: str | None
    #: Per event, oldest first: whether it verified (its link, and the seal, with the key when
    #: one is given; the plain chain without); None: sealed, and no key to check it with.
    verified: tuple[bool | None, ...]


def check(
    text: str | None, *, record: str | None = None, key: AuditKey | None = None
) -> HistoryCheck:
    """Check a history as stored (`AuditedStore.history`); `record`: its store key, which a
    check with the audit `key` needs (each record has its own history key)."""
    if key is not None and record is None:
        raise ValueError("checking a history with an audit key needs its record's store key")
    try:
        events = parse(text)
        seal_line = peel(text or "")[0]
        seal = None if seal_line is None else read_seal(seal_line)
    except ValueError as exc:
        return HistoryCheck("broken", f"unreadable: {exc}", ())
    count = len(events)
    if seal is not None and key is None:
        return HistoryCheck(
            "unchecked",
            f"sealed with audit key {seal.key_id}: its links are MACs, which only that key"
            f" checks (give it: ${KEY_VARIABLE}, or audit_key= in the store URL)",
            (None,) * count,
        )
    mac = None if key is None or record is None else key.record(record)

    def broken(problem: str, good: int = 0) -> HistoryCheck:
        return HistoryCheck("broken", problem, (True,) * good + (False,) * (count - good))

    if seal is not None and mac is not None and seal.key_id != mac.key_id:
        return broken(
            f"sealed with audit key {seal.key_id}, not with this one ({mac.key_id}): written"
            " under another key, or its seal forged"
        )
    adopted = count if seal is None else min(seal.adopted, count)
    found = _first_broken(events, mac, adopted, sealed=seal is not None)
    if found is not None:
        return broken(found[1], found[0])
    if mac is None:
        return HistoryCheck("ok", None, (True,) * count)
    if seal is None:
        return HistoryCheck(
            "unsealed",
            "not sealed with the audit key: written before the key was configured or by a writer"
            " without it, or its chain recomputed and its seal dropped by someone without the"
            " key; only an edit is caught in it",
            (False,) * count,
        )
    if mac.seal(seal.fields) != seal.mac:
        return broken(f"its seal does not match its MAC under audit key {mac.key_id}: rewritten")
    if seal.count != count:
        return broken(
            f"its seal says it holds {seal.count} events, and it holds {count}: events were cut"
            " out (or added) without the audit key"
        )
    if count and seal.head != events[-1].digest:
        return broken(
            f"its seal names {seal.head} as its newest event's digest, and its newest is"
            f" {events[-1].digest}: its newest events were cut off or replaced without the key"
        )
    if adopted:
        return HistoryCheck(
            "unsealed",
            f"its first {adopted} of {count} events were written without the audit key (before"
            " it was configured, or by a writer without it); only an edit is caught in those",
            (False,) * adopted + (True,) * (count - adopted),
        )
    return HistoryCheck("ok", None, (True,) * count)


def verify(
    text: str | None, *, record: str | None = None, key: AuditKey | None = None
) -> str | None:
    """None when the history holds as far as `key` can tell (`check`); else what is wrong."""
    return check(text, record=record, key=key).problem


def _first_broken(
    events: list[Event], mac: RecordMac | None, adopted: int, *, sealed: bool
) -> tuple[int, str] | None:
    """(index, problem) of the first event whose link does not hold: the first `adopted` as a
    plain chain, the rest MACed with `mac` (when given)."""
    prev = ""
    for event in events:
        anchor, at, code, fence, attempt, info, dig = split_line(event.line)
        if anchor is not None:
            if event.index != 0:
                return (
                    event.index,
                    f"event {event.index} ({event.kind}) claims a new start mid-chain",
                )
            prev = anchor
        body = f"{at}|{code}|{fence}|{attempt}|{info}"
        named = f"event {event.index} ({event.kind} at {event.at:.3f})"
        if mac is not None and event.index >= adopted:
            if mac.link(prev, body) != dig:
                return event.index, (
                    f"{named} does not match its MAC {dig} under audit key {mac.key_id}: changed"
                    " (its chain recomputed without the key), or chained to another predecessor"
                )
        elif plain_digest(prev, body) != dig:
            if mac is not None and not sealed and mac.link(prev, body) == dig:
                return event.index, (
                    f"{named} is MACed with audit key {mac.key_id}, and the history carries no"
                    " seal: its seal was removed"
                )
            return event.index, (
                f"{named} does not match its digest {dig}: changed, or chained to another"
                " predecessor"
            )
        prev = dig
    return None


def compare_stream(
    entries: Iterable[AuditEntry], histories: Mapping[str, str], *, stored: Container[str]
) -> list[tuple[str, str]]:
    """(record key, problem) for each record whose history disagrees with the audit stream:
    gone while its record is still `stored` (a history dies only with its record: rule 24), or
    missing the newest event the stream holds for it. Read the stream first, then the
    histories: an event written in between is then in a history and not in the stream, never
    the other way round."""
    newest: dict[str, AuditEntry] = {}
    for found in entries:
        newest[found.key] = found  # the stream is in the order events were written
    problems = []
    for record, last in newest.items():
        event = last.event
        told = f"{event.kind} at {event.written:.3f}, digest {event.digest}"
        text = histories.get(record)
        if text is None:
            if record in stored:
                problems.append(
                    (
                        record,
                        f"its history is gone, yet its record is stored and the audit stream"
                        f" holds its events (the newest: {told}): deleted",
                    )
                )
            continue
        try:
            events = parse(text)
        except ValueError:
            continue  # `check` names it
        if any(_holds(event, kept) for kept in events):
            continue
        if events and events[0].line.startswith("^") and event.written < events[0].at:
            continue  # dropped from the front since the stream was read (a history is bounded)
        problems.append(
            (
                record,
                f"the newest event the audit stream holds for it ({told}) is not in its history:"
                " the history was cut short or rewritten",
            )
        )
    return problems


def _holds(streamed: Event, kept: Event) -> bool:
    """Whether `kept` is the event `streamed`, or a later count of it (a replay or refusal
    counted again replaces its line, with a higher count)."""
    if kept.digest == streamed.digest:
        return True
    return (
        streamed.kind in (KINDS[code] for code in COUNTED)
        and (kept.kind, kept.fence, kept.at) == (streamed.kind, streamed.fence, streamed.at)
        and int(kept.details.get("count", "1")) > int(streamed.details.get("count", "1"))
    )
