"""A record's history (rule 20): one line per decision, hash-chained, written with the transition.

Why a text of lines, the same on every backend: the memory store keeps it in a dict, SQLite in a
row of its `history` table, Redis in one string beside the record (`scripts/lib.lua` mirrors
`append` in Lua), so one parser (`parse`) and one checker (`history_verify.check`) read them
all, and what `mcp-once keys history` prints does not depend on where the store lives.

A line is ``[^PREV|]AT|KIND|FENCE|ATTEMPT|DETAILS|DIGEST``:

* AT: milliseconds since the epoch (store clock). KIND: one letter (`KINDS`).
* DETAILS: ``k=v`` pairs joined by ``,`` (percent-encoded values), per kind (`Event.details`).
* DIGEST: the first 16 hex digits of SHA-1 over ``PREV|`` plus the line up to DETAILS, where
  PREV is the digest of the line before ("" for a record's first event). Each event thus carries
  the digest of the one before: changing, removing or reordering one breaks the chain there.
* ``^PREV|``: only on the first line kept once older lines were dropped (a history is bounded,
  `MAX_EVENTS`), so the chain still starts from a known digest.

Never an argument, a result or a raw key: sizes, durations, codes, digests, names. The record's
key is already a digest of (scope, tool, key), and is the history's name, not part of its lines.
So every claimed event names the server that claimed (``v=NAME``, read as ``server``): the
record's layout does not hold it, and operator tools must act within one server's records
(rule 25: `keys reconcile` asks a server's reconcilers only about records whose history names
it; `servers`).

Rule 19's reconciliation leaves two events. Its claim of the UNKNOWN record (`reconcile`) is a
``claimed`` event for the new fence, why ``reconcile``; the verdict, written by the transition that
applies it inside ``saying(reconciled=ANSWER)``, is a ``reconciled`` event with the answer
(happened, not_happened, unknown) just before that transition's own (completed, released; none
for the record left UNKNOWN). Redis scripts do the same: `reconcile.lua` writes the claimed event,
and `complete.lua`, `release.lua` and `leave_unknown.lua` a ``reconciled`` one when the caller
said ``a=ANSWER``.

A result the tool passed on from the server it called, which that server replayed (the proxy's
upstream answering from its own record), is completed inside ``saying(upstream="replayed")``: its
``completed`` event says ``upstream=replayed`` (`complete.lua` reads ``u=`` from what was said).

A holder that gives its execution up as unknown (the guard's `OutcomeLost`: a proxy's upstream
died mid-call) turns the record UNKNOWN with `leave_unknown` inside ``saying(why=...)``: an
``interrupted`` event with that why (the holder's words, which a re-send's -32012 repeats:
`interruption`), and ``ended=yes`` where the holder knows nothing of the execution can still be
running (an operator may then settle it as failed at once), where a lease that ran out leaves
``lease ran out``.

Replays and refusals are counted, not listed (rule 20): one of them that repeats the last line
(same kind, fence and code) replaces it with its count and last time, so a hot key's history does
not grow. The replaced line is re-chained from the same predecessor.

With an audit key (`audit_key.py`) DIGEST is the record's HMAC of the same text instead, and the
history starts with a seal, ``#KEYID|COUNT|ADOPTED|HEAD|MAC``, rewritten by every event with a
MAC over ``seal|KEYID|COUNT|ADOPTED|HEAD``: COUNT lines follow, the newest with digest HEAD, and
the first ADOPTED of them were found unsealed (written before the key, or by a writer without
it) and carry plain digests. A writer carries COUNT and ADOPTED over from the seal it finds and
never recounts them, so lines cut out stay a difference between the seal and the lines for as
long as the history lasts. A writer without the key keeps a seal it finds as it is (a seal that
no longer matches: `history_verify.py` reads it). Without a key nothing changes: no seal, and
the same lines as before.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import re
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable
from urllib.parse import quote, unquote

from .audit_key import AuditKey, RecordMac, record_mac
from .store import ClaimOutcome, ClaimStatus, Record, RecordState

#: Events a record's history keeps; older ones are dropped (the chain is anchored, see above).
MAX_EVENTS = 32
#: Entries an audit stream keeps (per Redis stream; the SQLite table and memory list too).
AUDIT_MAX_ENTRIES = 100_000
DIGEST_CHARS = 16
#: A keyed history's first line, its seal, starts with it (an event line starts with a digit).
SEAL_MARK = "#"

#: Event kinds as operators read them (issue 37 names them: a contract) and as stored.
KINDS: dict[str, str] = {
    "C": "claimed",
    "D": "completed",
    "P": "replayed",
    "X": "refused",
    "R": "released",
    "L": "lease ran out",
    "K": "reconciled",
    "I": "interrupted",
    "S": "settled",
    "G": "purged",
}
CODES = {name: code for code, name in KINDS.items()}
#: Kinds counted rather than listed: a repeat of the last line replaces it.
COUNTED = frozenset({"P", "X"})

#: Refusal codes of a claim, by the claim's status.
REFUSED = {
    ClaimStatus.MISMATCH: "key_reused",
    ClaimStatus.BUSY: "in_progress",
    ClaimStatus.UNKNOWN: "unknown",
}


@dataclass(frozen=True, slots=True)
class Event:
    """One line of a history, read back (`parse`)."""

    at: float
    kind: str  #: one of `KINDS`' values
    fence: int
    attempt: int
    details: dict[str, str]
    digest: str
    #: The digest of the event before, as the chain says it is.
    prev: str
    #: Position in the history as kept (0: the oldest kept), for naming it.
    index: int = 0
    line: str = field(default="", repr=False)

    @property
    def written(self) -> float:
        """When this line was written: a counted line's last time (a replay or refusal updates
        the line in place, keeping its first time as `at`), else `at`. What an audit stream
        orders and filters by: an update arrives when it is written."""
        last = self.details.get("last_at")
        return self.at if last is None else float(last)

    def as_json(self) -> dict[str, object]:
        return {
            "at": self.at,
            "event": self.kind,
            "fence": self.fence,
            "attempt": self.attempt,
            **self.details,
            "digest": self.digest,
            **({"prev": self.prev} if self.prev else {}),
        }


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One event in the audit stream: which record (its store key, a digest), which tool."""

    id: str
    key: str
    tool: str | None
    event: Event

    def as_json(self) -> dict[str, object]:
        return {"id": self.id, "record": self.key, "tool": self.tool, **self.event.as_json()}


@dataclass(frozen=True, slots=True)
class Said:
    """What the caller of a transition says about it that the store cannot see (`saying`)."""

    #: released: why (effect_free, nothing_done, cancelled, ...).
    why: str | None = None
    #: claimed: a digest of the caller's scope, its server's name (`CallScope.server`), so that
    #: a record knows its server (rule 25: operator tools act within one server's records), and
    #: a digest of its authenticated principal (if any).
    scope: str | None = None
    server: str | None = None
    principal: str | None = None
    #: settled, and reconciled by an operator (`keys reconcile`): by whom, and why.
    by: str | None = None
    reason: str | None = None
    #: A transition that is a reconciliation (issue 36): the system of record's answer.
    reconciled: str | None = None
    #: interrupted: "yes" when the holder knows its execution is over (`OutcomeLost.ended`).
    ended: str | None = None
    #: settled: "settled" when this settle replaces an operator's earlier one.
    replaces: str | None = None
    #: completed: the result is the replay of the server the tool called ("replayed": the proxy's
    #: upstream answered from its own record, rule 18).
    upstream: str | None = None


_NOTHING_SAID = Said()
_said: contextvars.ContextVar[Said | None] = contextvars.ContextVar(
    "mcp_once_history_said", default=None
)


@contextmanager
def saying(**said: str | None) -> Iterator[None]:
    """Tell the store's history what it cannot see about the transitions inside the block:

    ```python
    with saying(by="ops@host", reason="ticket 812 shows it charged"):
        await store.settle(key, result=..., retention=...)
    ```

    A side channel (like `unreadable_records`), so that the store protocol stays as it is; the
    SQLite writer runs each step in its caller's context, so it reaches every backend. A block
    inside another adds to what the outer one said (a reconciliation's answer stays said when
    the tool it runs is released, say, with its reason)."""
    outer = _said.get()
    # Nothing said around it (every guarded call's claim): the fields as given, without
    # `dataclasses.replace`'s walk over every field (a third of the block's cost per call).
    told = Said(**said) if outer is None else dataclasses.replace(outer, **said)
    token = _said.set(told)
    try:
        yield
    finally:
        _said.reset(token)


def said() -> Said:
    return _said.get() or _NOTHING_SAID


@contextmanager
def replacing_settle(fence: int | None) -> Iterator[None]:
    """Inside a store's `settle`: say that it replaces an operator's earlier settle, when it
    does (`replacing` given), for its settled event."""
    if fence is None:
        yield
        return
    with saying(replaces="settled"):
        yield


def scope_digest(scope: str) -> str:
    """The caller's scope (or its principal's canonical text) as the history keeps it: a digest,
    never the principal itself."""
    return hashlib.sha256(scope.encode()).hexdigest()[:DIGEST_CHARS]


@runtime_checkable
class AuditedStore(Protocol):
    """A store that keeps histories and an audit stream (every store this package ships; a
    store of one's own need not: the `KeyStore` protocol does not ask for it)."""

    async def history(self, key: str) -> str | None:
        """The record's history as stored (`parse` reads it); None: it has none."""
        ...

    async def histories(self) -> list[tuple[str, str]]:
        """Every history kept, (record key, history), sorted by key."""
        ...

    def iter_histories(self) -> AsyncIterator[tuple[str, str]]:
        """Every history kept, (record key, history), in the store's own order, read a batch at
        a time: for a reader that must not hold a million histories at once (`audit verify`)."""
        ...

    async def audit(self, *, since: float | None = None, limit: int = 1000) -> list[AuditEntry]:
        """The audit stream from `since` (seconds, store clock) on, oldest first."""
        ...


# -- which events a transition leaves ------------------------------------------------------------


def events(
    before: Record | None,
    after: Record | None,
    answer: object,
    *,
    said: Said | None = None,
    started: float | None = None,
) -> list[tuple[str, int, int, str]]:
    """The events of one transition, as (kind code, fence, attempt, details), read off the record
    before and after it and its answer: the one place that knows, for the stores that apply the
    pure rules (memory, SQLite). `scripts/lib.lua`'s callers make the same decisions in Lua.

    `started`: when the execution being completed was claimed (its claimed event), for the
    duration. Renewals (lease upkeep) and delivery marks leave none: they decide nothing about
    the call."""
    told = said or _said.get() or _NOTHING_SAID
    if (
        told.reconciled is not None
        and before is not None
        and before.state is RecordState.IN_PROGRESS
        and not isinstance(answer, ClaimOutcome)
    ):
        verdict = ("K", before.fence, before.attempts, reconciled(told))
        rest = Said(why=told.why, upstream=told.upstream)
        after_it = events(before, after, answer, said=rest, started=started)
        return [verdict, *after_it]
    if isinstance(answer, ClaimOutcome):
        return _claim_events(before, after, answer, told)
    if after is None or before is None:
        return []
    if before.state is RecordState.UNKNOWN and after.state is not RecordState.UNKNOWN:
        info = settled(after.state is RecordState.COMPLETED, told)
        return [("S", before.fence, before.attempts, info)]
    if told.replaces is not None and before.state is RecordState.COMPLETED:
        # An operator's settle corrected (`KeyStore.settle(..., replacing=)`).
        info = settled(after.state is RecordState.COMPLETED, told)
        return [("S", before.fence, before.attempts, info)]
    if before.state is not RecordState.IN_PROGRESS:
        return []
    if after.state is RecordState.COMPLETED:
        size = len(after.result or b"")
        took = round((after.updated_at - (started or before.created_at)) * 1000)
        done = details(s=str(size), d=str(took), u=told.upstream)
        return [("D", after.fence, after.attempts, done)]
    if after.state is RecordState.RELEASED:
        return [("R", before.fence, before.attempts, details(w=told.why or "released"))]
    if after.state is RecordState.UNKNOWN and told.why is not None:
        # Its holder gave the execution up as unknown (`OutcomeLost`), before its lease ran out.
        return [("I", before.fence, before.attempts, details(w=told.why, e=told.ended))]
    return []


def _claim_events(
    before: Record | None, after: Record | None, outcome: ClaimOutcome, told: Said
) -> list[tuple[str, int, int, str]]:
    status = outcome.status
    if status is ClaimStatus.CLAIMED:
        assert outcome.fence is not None
        if outcome.took_over and before is not None and before.state is RecordState.UNKNOWN:
            # Rule 19: claimed for its reconciliation (`reconcile`); its lost lease is already
            # in the history.
            return [("C", outcome.fence, outcome.attempts, claimed(told, "reconcile"))]
        claimed_event = ("C", outcome.fence, outcome.attempts, claimed(told))
        if outcome.took_over and before is not None:
            lost = ("L", before.fence, before.attempts, details(w="taken_over"))
            return [lost, claimed_event]
        return [claimed_event]
    if status is ClaimStatus.REPLAY:
        return [("P", outcome.fence or 0, outcome.attempts, "")]
    if (
        status is ClaimStatus.UNKNOWN
        and after is not None
        and before is not None
        and before.state is RecordState.IN_PROGRESS
    ):
        return [("L", before.fence, before.attempts, details(w="unknown"))]
    code = REFUSED.get(status)
    if code is None or before is None:
        return []
    return [("X", before.fence, before.attempts, details(c=code))]


def claimed(told: Said, why: str | None = None) -> str:
    """DETAILS of a claimed event: the claimer's scope digest, its server's name, its
    principal's digest, and why when it is not a plain call's claim (`reconcile`)."""
    return details(p=told.scope, v=told.server, i=told.principal, w=why)


def reconciled(told: Said) -> str:
    """DETAILS of a reconciled event: the answer, and who asked when an operator did."""
    return details(a=told.reconciled, b=told.by, r=told.reason)


def settled(done: bool, told: Said) -> str:
    """DETAILS of a settled event: as done or failed, by whom, why."""
    answer = "done" if done else "failed"
    return details(a=answer, b=told.by, r=told.reason, o=told.replaces)


#: What `details` leaves as it is: `quote`'s always-safe characters and ours. A value made of
#: them only (digests, numbers, names: nearly every value) is its own encoding, so it skips
#: `quote` (which would return it unchanged, at ~1 µs per value, per transition).
_SAFE = "@.-_:/ "
_PLAIN = re.compile(r"[A-Za-z0-9_.~@:/ -]*")


def details(**pairs: str | None) -> str:
    """DETAILS as stored: the pairs given (None left out), in the order given, values
    percent-encoded so that no separator of the line appears inside one."""
    return ",".join(
        f"{k}={v if _PLAIN.fullmatch(v) else quote(v, safe=_SAFE)}"
        for k, v in pairs.items()
        if v is not None
    )


# -- the chain -----------------------------------------------------------------------------------


def digest(prev: str, body: str) -> str:
    """The digest an event carries: SHA-1 over its predecessor's digest and its own body (the
    same as `redis.sha1hex` in lib.lua; tamper evidence, not a signature)."""
    return hashlib.sha1(f"{prev}|{body}".encode()).hexdigest()[:DIGEST_CHARS]


def append(
    text: str,
    code: str,
    fence: int,
    attempt: int,
    info: str,
    now: float,
    mac: RecordMac | None = None,
) -> str:
    """`text` (a history, "" for none) with one more event, chained, counted or bounded; with
    `mac` (the record's history key) linked by MACs and sealed (see the module doc)."""
    seal, text = peel(text)
    at = str(round(now * 1000))
    lines = text.split("\n") if text else []
    found = len(lines)
    last = split_line(lines[-1]) if lines else None
    replaced = last is not None and code in COUNTED and _repeats(last, code, fence, info)
    if replaced:
        assert last is not None
        count = int(_pairs(last[5]).get("n", "1")) + 1
        info = ",".join(p for p in (info, f"n={count}", f"l={at}") if p)
        lines.pop()
        prev = last[0] if last[0] is not None else (split_line(lines[-1])[6] if lines else "")
        anchored = last[0] is not None
        at = last[1]  # a counted line keeps its first time; `l` is the last one
    else:
        prev = last[6] if last is not None else ""
        anchored = False
    body = f"{at}|{code}|{fence}|{attempt}|{info}"
    line = f"{body}|{digest(prev, body) if mac is None else mac.link(prev, body)}"
    lines.append(f"^{prev}|{line}" if anchored else line)
    dropped = max(0, len(lines) - MAX_EVENTS)
    if dropped:
        # The first line kept names its predecessor's digest: the chain stays checkable.
        before = split_line(lines[dropped - 1])
        lines = lines[dropped:]
        if not lines[0].startswith("^"):
            lines[0] = f"^{before[6]}|{lines[0]}"
    joined = "\n".join(lines)
    if mac is None:
        return joined if seal is None else f"{seal}\n{joined}"
    count, adopted = _carried(seal, mac, found)
    if not replaced:
        count += 1
    elif adopted == count:  # the line replaced was an adopted one; its successor is keyed
        adopted -= 1
    count = max(0, count - dropped)
    adopted = min(count, max(0, adopted - dropped))
    return f"{sealed(mac, count, adopted, split_line(lines[-1])[6])}\n{joined}"


@dataclass(frozen=True, slots=True)
class Seal:
    """A keyed history's first line, read back (see the module doc)."""

    key_id: str
    count: int
    adopted: int
    head: str
    mac: str

    @property
    def fields(self) -> str:
        """What its MAC is over (after "seal|")."""
        return f"{self.key_id}|{self.count}|{self.adopted}|{self.head}"


def peel(text: str) -> tuple[str | None, str]:
    """(the history's seal line, or None when it has none; its event lines)."""
    if not text.startswith(SEAL_MARK):
        return None, text
    first, _, rest = text.partition("\n")
    return first, rest


def read_seal(line: str) -> Seal:
    """A seal line's fields; `ValueError` when it is not one."""
    parts = line[len(SEAL_MARK) :].split("|")
    if len(parts) != 5 or not all(parts) or not (parts[1].isdigit() and parts[2].isdigit()):
        raise ValueError(f"not a seal: {line!r}")
    key_id, count, adopted, head, mac = parts
    return Seal(key_id, int(count), int(adopted), head, mac)


def sealed(mac: RecordMac, count: int, adopted: int, head: str) -> str:
    """The seal line of a history of `count` lines (the first `adopted` unkeyed) ending at
    `head`."""
    fields = f"{mac.key_id}|{count}|{adopted}|{head}"
    return f"{SEAL_MARK}{fields}|{mac.seal(fields)}"


def _carried(seal: str | None, mac: RecordMac, found: int) -> tuple[int, int]:
    """(count, adopted) a keyed writer goes on from: those of its own key's seal, else (no
    seal, another key's, an unreadable one) every one of the `found` lines, adopted."""
    if seal is not None:
        try:
            mine = read_seal(seal)
        except ValueError:
            return found, found
        if mine.key_id == mac.key_id:
            return mine.count, mine.adopted
    return found, found


def _repeats(last: tuple[str | None, ...], code: str, fence: int, info: str) -> bool:
    if last[2] != code or last[3] != str(fence):
        return False
    mine = {k: v for k, v in _pairs(last[5] or "").items() if k not in ("n", "l")}
    return mine == _pairs(info)


def _pairs(info: str | None) -> dict[str, str]:
    if not info:
        return {}
    return dict(pair.split("=", 1) for pair in info.split(","))


def split_line(line: str) -> tuple[str | None, str, str, str, str, str, str]:
    """(anchor prev or None, at, code, fence, attempt, details, digest)."""
    anchor: str | None = None
    if line.startswith("^"):
        anchor, _, line = line[1:].partition("|")
    parts = line.split("|")
    if len(parts) != 6:
        raise ValueError(f"not a history line: {line!r}")
    at, code, fence, attempt, info, dig = parts
    return anchor, at, code, fence, attempt, info, dig


def parse(text: str | None) -> list[Event]:
    """The events of a history, oldest first (its seal, if any, is not one: `history_verify`
    reads it); none for a record written before histories (or whose history is gone). A line
    that cannot be read raises `ValueError` naming it."""
    text = peel(text or "")[1]
    if not text:
        return []
    found: list[Event] = []
    prev = ""
    for index, line in enumerate(text.split("\n")):
        try:
            anchor, at, code, fence, attempt, info, dig = split_line(line)
            event = Event(
                at=int(at) / 1000,
                kind=KINDS.get(code, code),
                fence=int(fence),
                attempt=int(attempt),
                details=_named(code, _pairs(info)),
                digest=dig,
                prev=anchor if anchor is not None else prev,
                index=index,
                line=line,
            )
        except ValueError as exc:
            raise ValueError(f"event {index}: {exc}") from exc
        found.append(event)
        prev = dig
    return found


#: DETAILS' keys as operators read them.
NAMES = {
    "p": "scope",
    "v": "server",
    "i": "principal",
    "s": "result_bytes",
    "d": "duration_ms",
    "n": "count",
    "l": "last_at",
    "c": "code",
    "w": "why",
    "a": "answer",
    "b": "by",
    "r": "reason",
    "u": "upstream",
    "e": "ended",
    "o": "replaces",
}


def _named(code: str, pairs: dict[str, str]) -> dict[str, str]:
    named = {NAMES.get(k, k): unquote(v) for k, v in pairs.items()}
    if code in COUNTED:
        named.setdefault("count", "1")
        if "last_at" in named:
            named["last_at"] = str(int(named["last_at"]) / 1000)
    return named


def servers(text: str | None) -> list[str]:
    """The servers a record's claimed events name, oldest first, each once: one for a record
    claimed only by its own server (the scope holds the server's name); none when its history
    is gone or holds no claimed event that names one (an earlier release, or dropped lines)."""
    found: list[str] = []
    for event in parse(text):
        name = event.details.get("server") if event.kind == "claimed" else None
        if name is not None and name not in found:
            found.append(name)
    return found


async def servers_of(store: object, key: str | Record) -> list[str]:
    """The servers the history of the record `key` names (`servers`); none when the store keeps
    no history or the history cannot be read (`mcp-once audit verify` names that one). Given
    a `Record` read with its history (`Record.history`), that history: no read of its own."""
    try:
        return servers(await history_of(store, key))
    except ValueError:
        return []


async def history_of(store: object, key: str | Record) -> str | None:
    """The history of the record `key` (a key, or a `Record`, whose history is used when it was
    read with it); None when the store keeps none."""
    if isinstance(key, Record):
        if key.history is not None:
            return key.history
        key = key.key
    if not isinstance(store, AuditedStore):
        return None
    return await store.history(key)


def interruption(text: str | None) -> Event | None:
    """The `interrupted` event that left the record UNKNOWN, when that is its newest decision
    (replays and refusals after it are counted, not decisions); None otherwise. `ValueError`
    for a history that cannot be read."""
    for event in reversed(parse(text)):
        if CODES.get(event.kind) in COUNTED:
            continue
        return event if event.kind == KINDS["I"] else None
    return None


def settled_by_operator(text: str | None, fence: int) -> Event | None:
    """The settled event that made a COMPLETED record of `fence` what it is, when an operator's
    settle did (its newest decision; replays and refusals after it are counted, not decisions):
    what `KeyStore.settle(..., replacing=fence)` may replace. None for an executed record (its
    newest decision is `completed`) or one whose history is gone. `ValueError` for a history
    that cannot be read."""
    for event in reversed(parse(text)):
        if CODES.get(event.kind) in COUNTED:
            continue
        settled = event.kind == KINDS["S"] and event.details.get("answer") == "done"
        return event if settled and event.fence == fence else None
    return None


def claimed_at(text: str) -> float | None:
    """When the newest claimed event of a history happened (seconds), if it has one."""
    text = peel(text)[1]
    for line in reversed(text.split("\n") if text else []):
        fields = split_line(line)
        if fields[2] == "C":
            return int(fields[1]) / 1000
    return None


def last_line(text: str) -> str:
    """The newest line of a history (what the audit stream receives)."""
    return text.rpartition("\n")[2]


def entry(id: str, key: str, tool: str | None, line: str) -> AuditEntry:
    """An audit stream entry read back; its line may be an anchored one."""
    return AuditEntry(id, key, tool or None, parse(line)[0])


def starts_anew(before: Record | None, now: float) -> bool:
    """Whether a transition at `now` that finds `before` starts a new history (no live record:
    the last one's history died with it, rule 24), so that the history kept is not read."""
    return before is None or (before.expires_at is not None and before.expires_at <= now)


def note(
    text: str,
    before: Record | None,
    after: Record | None,
    answer: object,
    now: float,
    said: Said | None = None,
    mac: RecordMac | None = None,
) -> tuple[str, list[str]]:
    """`text` with the events of one transition appended, and the lines added (for the audit
    stream): the whole of what memory and SQLite do per transition (`mac`: the record's history
    key, with an audit key). A transition that finds no live record starts a new one, and
    with it a new history: the last record's history died with it (rule 24)."""
    if starts_anew(before, now):
        text = ""
    added: list[str] = []
    started = claimed_at(text) if isinstance(answer, bool) else None
    for code, fence, attempt, info in events(before, after, answer, said=said, started=started):
        text = append(text, code, fence, attempt, info, now, mac)
        added.append(last_line(text))
    return text, added


def purged(text: str, record: Record, now: float, mac: RecordMac | None = None) -> str:
    """The purged event's line, for the audit stream: the record is gone from the store, and
    its history (`text`) with it (rule 24)."""
    return last_line(append(text, "G", record.fence, record.attempts, "", now, mac))


class Trail:
    """Histories and the audit stream of the memory store: a dict and a bounded list."""

    def __init__(self, audit_key: AuditKey | None = None) -> None:
        self.histories: dict[str, str] = {}
        self.audit_key = audit_key
        #: (id, at, key, tool, line), oldest first; at most AUDIT_MAX_ENTRIES.
        self.stream: deque[tuple[int, float, str, str | None, str]] = deque(
            maxlen=AUDIT_MAX_ENTRIES
        )
        self._next_id = 1

    def note(
        self, key: str, before: Record | None, after: Record | None, answer: object, now: float
    ) -> None:
        text, added = note(
            self.histories.get(key, ""),
            before,
            after,
            answer,
            now,
            mac=record_mac(self.audit_key, key),
        )
        if added:
            record = after or before
            self._keep(key, text, record.tool if record else None, added, now)

    def purged(self, key: str, record: Record, now: float) -> None:
        """The record is gone, and its history with it (rule 24); the stream says so."""
        text = self.histories.pop(key, "")
        line = purged(text, record, now, record_mac(self.audit_key, key))
        self.stream.append((self._next_id, now, key, record.tool, line))
        self._next_id += 1

    def read(self, since: float | None, limit: int) -> list[AuditEntry]:
        found = []
        for id, at, key, tool, line in self.stream:
            if since is not None and at < since:
                continue
            found.append(entry(str(id), key, tool, line))
            if len(found) >= limit:
                break
        return found

    def _keep(self, key: str, text: str, tool: str | None, added: list[str], now: float) -> None:
        self.histories[key] = text
        for line in added:
            self.stream.append((self._next_id, now, key, tool, line))
            self._next_id += 1
