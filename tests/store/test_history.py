"""Rule 20 on every backend: each transition leaves its event in the record's history and the
audit stream, in the same store operation; replays and refusals are counted; the chain is
checkable; nothing stored there is an argument, a result or a raw key.

The `backend` fixture runs each test on memory, SQLite, Redis (asyncio and trio), a Redis
Cluster and Redis through Sentinel (the last two in the full tier).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from history_tamper import redis_history
from store_backends import Backend, sync_redis_client, write_history

from idempotency import (
    AuditedStore,
    MemoryKeyStore,
    RedisKeyStore,
    SQLiteKeyStore,
    history_interruption,
    history_operator_settle,
    history_saying,
    parse_history,
    verify_history,
)
from idempotency._stores import history as chain
from idempotency._stores.store import ClaimOutcome, ClaimStatus, Record

pytestmark = pytest.mark.anyio

#: Values that must never appear in a history or the audit stream.
SECRET_RESULT = b"result-SENTINEL-7f3a9c"
SECRET_FINGERPRINT = "fingerprint-SENTINEL-51d2e0"
TOOL = "charge"


def audited(backend: Backend) -> AuditedStore:
    assert isinstance(backend.store, AuditedStore)
    return backend.store


async def kinds(backend: Backend, key: str) -> list[str]:
    return [event.kind for event in parse_history(await audited(backend).history(key))]


async def test_a_key_tells_its_story(backend: Backend) -> None:
    store = backend.store
    claimed = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert claimed.token is not None
    await backend.advance(0.25)
    assert await store.complete("k", claimed.token, b"x" * 200, retention=600)
    for _ in range(3):
        await store.claim("k", "fp", lease=30, takeover=False)
    await store.claim("k", "other", lease=30, takeover=False)
    text = await audited(backend).history("k")
    events = parse_history(text)
    assert [e.kind for e in events] == ["claimed", "completed", "replayed", "refused"]
    assert events[1].details["result_bytes"] == "200"
    assert 240 <= int(events[1].details["duration_ms"]) <= 300
    assert events[2].details["count"] == "3"  # one entry for three replays
    assert events[3].details["code"] == "key_reused"
    assert {e.fence for e in events} == {1}
    assert verify_history(text) is None


async def test_a_busy_refusal_and_a_release_say_why(backend: Backend) -> None:
    store = backend.store
    held = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert held.token is not None
    for _ in range(2):
        await store.claim("k", "fp", lease=30, takeover=False)
    with history_saying(why="effect_free"):
        assert await store.release("k", held.token)
    events = parse_history(await audited(backend).history("k"))
    assert [e.kind for e in events] == ["claimed", "refused", "released"]
    assert (events[1].details["code"], events[1].details["count"]) == ("in_progress", "2")
    assert events[2].details["why"] == "effect_free"


async def test_a_lost_lease_then_an_operator_settles(backend: Backend) -> None:
    store = backend.store
    await store.claim("k", "fp", lease=1, takeover=False, tool=TOOL)
    await backend.advance(2)
    await store.claim("k", "fp", lease=1, takeover=False)  # the lease ran out: UNKNOWN
    await store.claim("k", "fp", lease=1, takeover=False)  # refused: unknown
    with history_saying(by="ops@host", reason="ticket 812: charged"):
        assert await store.settle("k", result=SECRET_RESULT, retention=600)
    events = parse_history(await audited(backend).history("k"))
    assert [e.kind for e in events] == ["claimed", "lease ran out", "refused", "settled"]
    assert events[1].details["why"] == "unknown"
    assert events[2].details["code"] == "unknown"
    assert events[3].details == {
        "answer": "done",
        "by": "ops@host",
        "reason": "ticket 812: charged",
    }


async def test_a_takeover_shows_the_lease_lost_and_the_new_fence(backend: Backend) -> None:
    store = backend.store
    await store.claim("k", "fp", lease=1, takeover=True, tool=TOOL)
    await backend.advance(2)
    taken = await store.claim("k", "fp", lease=1, takeover=True)
    assert taken.took_over
    events = parse_history(await audited(backend).history("k"))
    assert [(e.kind, e.fence) for e in events] == [
        ("claimed", 1),
        ("lease ran out", 1),
        ("claimed", 2),
    ]
    assert events[1].details["why"] == "taken_over"


async def test_the_audit_stream_holds_every_event_in_order_naming_record_and_tool(
    backend: Backend,
) -> None:
    store = backend.store
    for key in ("a", "b"):
        await backend.advance(1)
        claimed = await store.claim(key, "fp", lease=30, takeover=False, tool=f"tool-{key}")
        assert claimed.token is not None
        await store.complete(key, claimed.token, b"r", retention=600)
    found = await audited(backend).audit()
    assert [(e.key, e.tool, e.event.kind) for e in found] == [
        ("a", "tool-a", "claimed"),
        ("a", "tool-a", "completed"),
        ("b", "tool-b", "claimed"),
        ("b", "tool-b", "completed"),
    ]
    later = await audited(backend).audit(since=found[2].event.at)
    assert [e.key for e in later] == ["b", "b"]


async def test_no_argument_result_or_fingerprint_is_kept(backend: Backend) -> None:
    store = backend.store
    claimed = await store.claim("k", SECRET_FINGERPRINT, lease=30, takeover=False, tool=TOOL)
    assert claimed.token is not None
    await store.complete("k", claimed.token, SECRET_RESULT, retention=600)
    await store.claim("k", SECRET_FINGERPRINT, lease=30, takeover=False)
    seen = json.dumps(
        [
            await audited(backend).history("k"),
            await audited(backend).histories(),
            [e.as_json() for e in await audited(backend).audit()],
            *raw_history_storage(backend),
        ]
    )
    for secret in (SECRET_RESULT.decode(), SECRET_FINGERPRINT):
        assert secret not in seen


async def test_verify_passes_then_names_the_event_a_changed_byte_broke(backend: Backend) -> None:
    store = backend.store
    claimed = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert claimed.token is not None
    await store.complete("k", claimed.token, b"r" * 10, retention=600)
    await store.claim("k", "fp", lease=30, takeover=False)
    for key, text in await audited(backend).histories():
        assert verify_history(text) is None, key
    text = await audited(backend).history("k")
    assert text is not None
    tampered = text.replace("s=10", "s=11")  # one byte of the completed event
    assert tampered != text
    await overwrite_history(backend, "k", tampered)
    problem = verify_history(await audited(backend).history("k"))
    assert problem is not None and problem.startswith("event 1 (completed"), problem


async def test_a_history_is_bounded_and_stays_checkable(backend: Backend) -> None:
    store = backend.store
    for _ in range(chain.MAX_EVENTS):
        claimed = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
        assert claimed.token is not None
        assert await store.release("k", claimed.token)
    text = await audited(backend).history("k")
    assert text is not None
    events = parse_history(text)
    assert len(events) == chain.MAX_EVENTS
    assert text.startswith("^")  # anchored: the first kept names the digest before it
    assert events[-1].fence == chain.MAX_EVENTS
    assert verify_history(text) is None


async def test_a_renewed_calls_history_lives_as_long_as_its_record(backend: Backend) -> None:
    """A call that runs longer than a day keeps its history (an IN_PROGRESS record has no
    expiry: rule 25, and its history is inside it: rule 24), so its completion continues the
    chain (and has its duration). One renewal with a long lease stands for many short ones.
    Memory and SQLite: time is moved past it and expired rows purged. Redis: keys expire on the
    server's real clock, which the test offset does not move, so the record's time to live is
    read instead (none), and that nothing else is kept for it but its fence memo."""
    store = backend.store
    day = 24 * 3600.0
    claimed = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert claimed.token is not None
    assert await store.renew("k", claimed.token, lease=3 * day)
    if isinstance(store, RedisKeyStore):
        with sync_redis_client(backend.location) as client:
            assert client.pttl(f"{backend.prefix}{{k}}") == -1
            assert client.exists(f"{backend.prefix}{{k}}:h") == 0  # no second key
    await backend.advance(2.5 * day)  # past lease + retention
    await store.purge_expired()  # the record is alive: nothing of it goes
    assert await store.complete("k", claimed.token, b"r", retention=600)
    events = parse_history(await audited(backend).history("k"))
    assert [e.kind for e in events] == ["claimed", "completed"]
    assert int(events[1].details["duration_ms"]) >= 2.5 * day * 1000


async def test_a_purged_records_history_goes_with_it(backend: Backend) -> None:
    """Rule 24: the history dies with its record; an audit stream, where kept, says it went."""
    store = backend.store
    claimed = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert claimed.token is not None
    await store.complete("k", claimed.token, b"r", retention=1)
    await backend.advance(5)
    assert await store.purge_expired() == 1
    assert await store.get("k") is None
    assert await audited(backend).history("k") is None
    assert await audited(backend).histories() == []
    trail = [e.event.kind for e in await audited(backend).audit() if e.key == "k"]
    assert trail == ([] if _reads_histories(backend) else ["claimed", "completed", "purged"])


def _reads_histories(backend: Backend) -> bool:
    """Whether the backend's audit trail is read from its histories (Redis without the stream:
    the default, and always on a cluster) rather than from a stream of its own."""
    return isinstance(backend.store, RedisKeyStore) and not backend.store._audit_stream


async def test_a_record_claimed_anew_after_expiry_starts_a_new_history(
    backend: Backend,
) -> None:
    """A new record under a key whose last record expired starts its own history (rule 24: the
    last one's went with it; its fence goes on, rule 25), and a completion whose claim is not
    the history's last line (a refusal came between: its duration is still read)."""
    store = backend.store
    claimed = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert claimed.token is not None
    await store.complete("k", claimed.token, b"r", retention=1)
    await backend.advance(5)
    again = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert again.token is not None and again.fence == 2  # rule 25: the fence goes on
    await backend.advance(0.25)
    await store.claim("k", "fp", lease=30, takeover=False)  # refused: in progress
    assert await store.complete("k", again.token, b"r" * 7, retention=600)
    text = await audited(backend).history("k")
    events = parse_history(text)
    assert [e.kind for e in events] == ["claimed", "refused", "completed"]
    assert events[0].fence == 2 and events[0].prev == ""
    assert events[2].details["result_bytes"] == "7"
    assert 240 <= int(events[2].details["duration_ms"]) <= 300
    assert verify_history(text) is None


async def test_the_audit_stream_names_any_key_and_tool_and_reads_older_entries(
    backend: Backend,
) -> None:
    """The Redis stream packs an entry into one field (the line, the tool's length and name,
    then the key): a key or tool name holding a newline or a bar reads back whole, and entries
    written before that (fields `k`, `t`, `e`) read as they did."""
    store = backend.store
    key, tool = "line\nbreak|bar{x}", "tool\nname|x"
    stream = isinstance(store, RedisKeyStore) and not _reads_histories(backend)
    older = "1700000000000|C|1|1|p=00|" + chain.digest("", "1700000000000|C|1|1|p=00")
    if stream:
        with sync_redis_client(backend.location) as client:
            client.xadd(f"{backend.prefix}audit", {"k": "old", "t": "legacy", "e": older}, id="1-1")
    claimed = await store.claim(key, "fp", lease=30, takeover=False, tool=tool)
    assert claimed.token is not None
    found = await audited(backend).audit()
    assert [(e.key, e.tool, e.event.kind) for e in found] == [
        *([("old", "legacy", "claimed")] if stream else []),
        (key, tool, "claimed"),
    ]


async def test_a_record_without_history_reads_as_having_none(backend: Backend) -> None:
    assert await audited(backend).history("never-written") is None
    assert parse_history(None) == []
    assert verify_history(None) is None


# -- one backend at a time ----------------------------------------------------------------------


async def test_without_history_nothing_is_written(tmp_path: Any) -> None:
    memory = MemoryKeyStore(history=False)
    sqlite = SQLiteKeyStore(tmp_path / "k.db", history=False)
    for store in (memory, sqlite):
        claimed = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
        assert claimed.token is not None
        await store.complete("k", claimed.token, b"r", retention=600)
        assert await store.history("k") is None
        assert await store.audit() == []
    await sqlite.aclose()


async def test_an_earlier_releases_sqlite_file_gains_the_tables_in_place(tmp_path: Any) -> None:
    path = tmp_path / "k.db"
    store = SQLiteKeyStore(path)
    claimed = await store.claim("old", "fp", lease=30, takeover=False, tool=TOOL)
    assert claimed.token is not None
    await store.aclose()
    with sqlite3.connect(path) as conn:  # as the previous release left it: no history tables
        conn.execute("DROP TABLE history")
        conn.execute("DROP TABLE audit")
    store = SQLiteKeyStore(path)
    assert await store.history("old") is None  # written before: no history, no error
    assert await store.complete("old", claimed.token, b"r", retention=600)
    assert await kinds_of(store, "old") == ["completed"]
    await store.aclose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1  # still readable by it


async def kinds_of(store: AuditedStore, key: str) -> list[str]:
    return [event.kind for event in parse_history(await store.history(key))]


async def test_sqlite_writes_the_events_in_the_transitions_commit(tmp_path: Any) -> None:
    store = SQLiteKeyStore(tmp_path / "k.db")
    claimed = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert claimed.token is not None
    await store.complete("k", claimed.token, b"r", retention=600)
    await store.claim("k", "fp", lease=30, takeover=False)
    assert store._writer.commits == 3  # one per transition, events included
    assert await kinds_of(store, "k") == ["claimed", "completed", "replayed"]
    await store.aclose()


# -- reaching into the stored data --------------------------------------------------------------


def raw_history_storage(backend: Backend) -> list[str]:
    """Everything the backend stored for histories and the audit stream, as text."""
    store = backend.store
    if isinstance(store, MemoryKeyStore):
        trail = store._trail
        assert trail is not None
        return [repr(trail.histories), repr(list(trail.stream))]
    if isinstance(store, SQLiteKeyStore):
        with sqlite3.connect(backend.location) as conn:
            rows = [*conn.execute("SELECT * FROM history"), *conn.execute("SELECT * FROM audit")]
        return [repr(rows)]
    assert isinstance(store, RedisKeyStore)
    with sync_redis_client(backend.location) as client:
        found = []
        for name in client.scan_iter(match=f"{backend.prefix}*"):
            kind = client.type(name)
            if kind == b"stream":
                found.append(repr(client.xrange(name)))
            elif kind == b"string" and name.endswith(b"}"):  # a record: its history inside
                found.append(repr(redis_history(client.get(name))))
        return found


async def overwrite_history(backend: Backend, key: str, text: str) -> None:
    write_history(backend, key, text)


@pytest.mark.parametrize("answer", ["happened", "not_happened", "unknown"])
async def test_a_reconciliation_leaves_its_claim_and_its_answer(
    backend: Backend, answer: str
) -> None:
    """Rule 19 in the history: the reconciliation's claim (why: reconcile, the next fence), then
    the answer just before the transition that applies it (the guard and `keys reconcile` write
    it inside `history_saying(reconciled=...)`)."""
    store = backend.store
    await store.claim("k", "fp", lease=1, takeover=False, tool=TOOL)
    await backend.advance(2)
    await store.claim("k", "fp", lease=1, takeover=False)  # the lease ran out: UNKNOWN
    held = await store.reconcile("k", "fp", 1, lease=30)  # type: ignore[attr-defined]
    assert held is not None and held.token is not None and held.fence == 2
    with history_saying(reconciled=answer):
        if answer == "happened":
            assert await store.complete("k", held.token, SECRET_RESULT, retention=600)
        elif answer == "not_happened":  # as `keys reconcile` does: the retry runs the tool
            assert await store.release("k", held.token)
        else:
            assert await store.leave_unknown("k", held.token)  # type: ignore[attr-defined]
    text = await audited(backend).history("k")
    events = parse_history(text)
    after = {"happened": ["completed"], "not_happened": ["released"], "unknown": []}[answer]
    assert [e.kind for e in events] == [
        "claimed", "lease ran out", "claimed", "reconciled", *after
    ]  # fmt: skip
    assert (events[2].fence, events[2].details.get("why")) == (2, "reconcile")
    assert (events[3].fence, events[3].details) == (2, {"answer": answer})
    assert verify_history(text) is None


def test_a_saying_inside_another_adds_to_it() -> None:
    """A reconciliation's answer stays said when the tool it lets run is released with a reason
    (the guard's `saying(why=...)` inside its `saying(reconciled=...)`)."""
    with history_saying(reconciled="not_happened"):
        with history_saying(why="effect_free"):
            assert chain.said() == chain.Said(why="effect_free", reconciled="not_happened")
        assert chain.said() == chain.Said(reconciled="not_happened")
    assert chain.said() == chain.Said()


async def test_a_holder_giving_its_execution_up_leaves_an_interrupted_event(
    backend: Backend,
) -> None:
    """The guard's `OutcomeLost` (a proxy's upstream died mid-call): the holder turns its own
    claim UNKNOWN inside `history_saying(why=...)`, fenced on its token, before its lease ran
    out. One ``interrupted`` event with the why; a stale token changes nothing and says nothing."""
    store = backend.store
    held = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert held.token is not None
    with history_saying(why="interrupted"):
        assert await store.leave_unknown("k", held.token)  # type: ignore[attr-defined]
        assert not await store.leave_unknown("k", held.token)  # type: ignore[attr-defined]
    record = await store.get("k")
    assert record is not None and record.state.value == "unknown"
    text = await audited(backend).history("k")
    events = parse_history(text)
    assert [e.kind for e in events] == ["claimed", "interrupted"]
    assert (events[1].fence, events[1].details) == (1, {"why": "interrupted"})
    assert verify_history(text) is None
    refused = await store.claim("k", "fp", lease=30, takeover=False)
    assert refused.status.value == "unknown"


async def test_an_interrupted_event_keeps_its_holders_words_and_whether_it_ended(
    backend: Backend,
) -> None:
    """What the proxy says of an upstream child that died mid-call reaches the history as said,
    with `ended`, and stays the record's last decision through the refusals after it
    (`history_interruption`: what a re-send's -32012 and `keys settle` read)."""
    store = backend.store
    why = "the upstream process exited while the call ran; its effect may have happened"
    held = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert held.token is not None
    with history_saying(why=why, ended="yes"):
        assert await store.leave_unknown("k", held.token)  # type: ignore[attr-defined]
    for _ in range(2):
        await store.claim("k", "fp", lease=30, takeover=False)
    text = await audited(backend).history("k")
    assert [e.kind for e in parse_history(text)] == ["claimed", "interrupted", "refused"]
    found = history_interruption(text)
    assert found is not None and found.details == {"why": why, "ended": "yes"}
    assert verify_history(text) is None
    # A lease that ran out is not an interruption.
    other = await store.claim("j", "fp", lease=1, takeover=False, tool=TOOL)
    assert other.token is not None
    await backend.advance(2)
    assert (await store.claim("j", "fp", lease=30, takeover=False)).status.value == "unknown"
    assert history_interruption(await audited(backend).history("j")) is None


async def test_an_operators_settle_is_replaced_only_under_its_own_fence(backend: Backend) -> None:
    """`settle(..., replacing=fence)`: the record COMPLETED under that fence takes the new
    verdict (a result, or failed: released), in a settled event saying it replaces the earlier
    one; under another fence, or without `replacing`, nothing changes. Which COMPLETED record an
    operator's settle made, the history says (`history_operator_settle`); an executed one has
    none."""
    store = backend.store
    held = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert held.token is not None
    with history_saying(why="interrupted"):
        assert await store.leave_unknown("k", held.token)  # type: ignore[attr-defined]
    with history_saying(by="ana"):
        assert await store.settle("k", result=b"first", retention=600)
    assert not await store.settle("k", result=b"second", retention=600)
    assert not await store.settle("k", result=b"second", retention=600, replacing=2)
    text = await audited(backend).history("k")
    earlier = history_operator_settle(text, 1)
    assert earlier is not None and earlier.details["by"] == "ana"
    with history_saying(by="bo", reason="typo"):
        assert await store.settle("k", result=b"second", retention=600, replacing=1)
    record = await store.get("k")
    assert record is not None and record.result == b"second" and record.fence == 1
    replay = await store.claim("k", "fp", lease=30, takeover=False)
    assert replay.status.value == "replay" and replay.result == b"second"
    with history_saying(by="bo"):
        assert await store.settle("k", result=None, retention=600, replacing=1)
    assert await store.get("k") is None  # released: the next claim runs, fence 2
    text = await audited(backend).history("k")
    settles = [e.details for e in parse_history(text) if e.kind == "settled"]
    assert settles == [
        {"answer": "done", "by": "ana"},
        {"answer": "done", "by": "bo", "reason": "typo", "replaces": "settled"},
        {"answer": "failed", "by": "bo", "replaces": "settled"},
    ]
    assert verify_history(text) is None
    again = await store.claim("k", "fp", lease=30, takeover=False)
    assert again.status.value == "claimed" and again.fence == 2
    # An executed record: no operator's settle to replace.
    assert again.token is not None
    assert await store.complete("k", again.token, b"ran", retention=600)
    assert history_operator_settle(await audited(backend).history("k"), 2) is None


async def test_a_record_claimed_anew_over_a_long_history_starts_anew(backend: Backend) -> None:
    """A key whose expired record carries a history too long for Redis's short path (over 1 KB):
    its next claim starts a history of its own (rule 24), and the fence goes on (rule 25)."""
    store = backend.store
    for n in range(chain.MAX_EVENTS // 2):  # a refusal and a replay a turn: a line each
        if n == 0:
            claimed = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
            assert claimed.token is not None
            await store.complete("k", claimed.token, b"r", retention=1)
        await store.claim("k", f"other-{n}", lease=30, takeover=False)
        await store.claim("k", "fp", lease=30, takeover=False)
    assert len((await audited(backend).history("k") or "").encode()) > 1024
    await backend.advance(5)
    again = await store.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert again.token is not None and again.fence == 2  # rule 25: the fence goes on
    text = await audited(backend).history("k")
    assert [e.kind for e in parse_history(text)] == ["claimed"]
    assert verify_history(text) is None


def test_sqlite_reads_a_stored_history_only_for_a_transition_that_continues_it() -> None:
    """A batch's first claim of a key with no live record starts a new history: the stored one
    is not read (one statement less per first execution). A later transition of the same batch
    that finds a live record with nothing noted yet (here a settle that created it without an
    event, then its completion) still continues the stored history, as before."""
    from idempotency._stores import _sqlite_history
    from idempotency._stores.store import RecordState

    def record(state: RecordState, expires_at: float | None = None) -> Record:
        return Record(
            "k", state, "fp", 1, 1, "t", 10.0, 10.0, None, None, expires_at, None, tool=TOOL
        )

    conn = sqlite3.connect(":memory:")
    _sqlite_history.create(conn)
    old = chain.append("", "C", 1, 1, "", 5.0)
    conn.execute("INSERT INTO history VALUES ('k', ?, ?, NULL)", (TOOL, old))
    reads: list[str] = []
    conn.set_trace_callback(lambda sql: reads.append(sql) if "IN (" in sql else None)

    in_progress, done = record(RecordState.IN_PROGRESS), record(RecordState.COMPLETED, 99.0)
    claimed = ClaimOutcome(ClaimStatus.CLAIMED, token="t", fence=1, attempts=1)
    _sqlite_history.keep(conn, [("k", None, in_progress, claimed, chain.Said(), 20.0)])
    assert reads == []  # a first claim: nothing read
    (fresh,) = conn.execute("SELECT lines FROM history WHERE key = 'k'").fetchone()
    assert [event.kind for event in parse_history(fresh)] == ["claimed"]

    conn.execute("UPDATE history SET lines = ?", (old,))
    reads.clear()
    seen: list[_sqlite_history.Seen] = [
        ("k", None, in_progress, True, chain.Said(), 20.0),  # no event: nothing noted
        ("k", in_progress, done, True, chain.Said(), 21.0),
    ]
    _sqlite_history.keep(conn, seen)
    assert len(reads) == 1
    (continued,) = conn.execute("SELECT lines FROM history WHERE key = 'k'").fetchone()
    assert [event.kind for event in parse_history(continued)] == ["claimed", "completed"]
    assert continued.startswith(old)
