"""Stateful property test: every backend behaves like a tiny reference model of the contract.

Hypothesis drives a real store and `Model` (a few dozen lines written from `semantics.md`, on
purpose NOT from `idempotency._stores.transitions`, so a shared misreading cannot hide) with the
same random claims, renewals, completions, releases (current, stale and forged tokens), settles,
purges and clock moves, and compares every answer and every record.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fake_clock import EPOCH
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from store_backends import Backend, make_memory, make_redis, make_redis_sentinel, make_sqlite

from idempotency import ClaimOutcome, ClaimStatus, Record, RecordState
from idempotency._stores.store import FENCE_MEMORY

T = TypeVar("T")

KEYS = st.sampled_from(["a", "b"])
#: Mostly the same arguments, sometimes others (a reused key).
FINGERPRINTS = st.sampled_from(["f1", "f1", "f1", "f2"])
#: Durations are in hundreds of seconds: Redis's clock also moves in real time while an example
#: runs (well under a minute), so every deadline the model compares must be far from every
#: instant the model can reach; with steps of >= 100 s real time can never flip a comparison.
LEASES = st.sampled_from([500, 1000])
RETENTIONS = st.sampled_from([300, 6000])
ORPHAN = 20_000
STEPS = st.sampled_from([100, 500, 1000, 1000, 3000, 7000, 30_000])
#: How far Redis's real-time drift may move a reported time; far below any step.
DRIFT = 60.0
RESULTS = st.sampled_from([b"r1", b"r2", b"", b"\x00\xff"])
#: Which token a worker presents: 0 = the newest issued for the key, 1.. = older (stale) ones,
#: past the end = one the store never issued.
TOKEN_AGE = st.sampled_from([0, 0, 0, 1, 2, 3])


# -- the reference model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    state: RecordState
    fingerprint: str
    fence: int
    attempts: int
    token: str | None
    lease_end: float | None
    completed_at: float | None
    expires: float | None
    result: bytes | None


class Model:
    """The contract in a dict. A row past its expiry is forgotten (but still counts for purge);
    a released row is invisible yet keeps its fence, so fences only grow while it is kept. An
    IN_PROGRESS or UNKNOWN row never expires. A forgotten row's fence is remembered for
    FENCE_MEMORY past its expiry, stored or purged: a claim of its key is a new intent,
    attempts from 1, with a higher fence (rule 25)."""

    def __init__(self, now: float, orphan: float) -> None:
        self.now = now
        self.orphan = orphan
        self.rows: dict[str, Row] = {}
        #: key -> (last fence, expiry) of the rows purged
        self.fences: dict[str, tuple[int, float]] = {}

    def live(self, key: str) -> Row | None:
        row = self.rows.get(key)
        if row is None or (row.expires is not None and row.expires <= self.now):
            return None
        return row

    def visible(self, key: str) -> Row | None:
        row = self.live(key)
        return None if row is None or row.state is RecordState.RELEASED else row

    def last_fence(self, key: str) -> int:
        """The fence of the key's forgotten record (0: none remembered)."""
        stored = self.rows.get(key)
        fence, expired = (stored.fence, stored.expires) if stored else self.fences.get(key, (0, 0))
        return fence if expired is not None and expired + FENCE_MEMORY > self.now else 0

    def claim(self, key: str, fp: str, lease: float, takeover: bool) -> tuple[str, dict[str, Any]]:
        row, now = self.live(key), self.now
        if row is None or row.state is RecordState.RELEASED:
            fence = (row.fence if row else self.last_fence(key)) + 1
            attempts = row.attempts + 1 if row else 1
            self.rows[key] = Row(
                RecordState.IN_PROGRESS, fp, fence, attempts, None, now + lease, None, None, None,
            )  # fmt: skip
            return "claimed", {"fence": fence, "attempts": attempts, "took_over": False}
        if row.fingerprint != fp:
            return "mismatch", {}
        if row.state is RecordState.COMPLETED:
            return "replay", {
                "fence": row.fence,
                "attempts": row.attempts,
                "result": row.result,
                "completed_at": row.completed_at,
            }
        if row.state is RecordState.UNKNOWN:
            return "unknown", {}
        assert row.lease_end is not None
        if now < row.lease_end:
            return "busy", {"retry_after": row.lease_end - now}
        if not takeover:
            self.rows[key] = replace(row, state=RecordState.UNKNOWN, token=None, expires=None)
            return "unknown", {}
        self.rows[key] = replace(
            row, fence=row.fence + 1, attempts=row.attempts + 1, lease_end=now + lease
        )
        return "claimed", {"fence": row.fence + 1, "attempts": row.attempts + 1, "took_over": True}

    def adopt(self, key: str, token: str) -> None:
        """The store picks the token; the model only remembers who holds the claim."""
        self.rows[key] = replace(self.rows[key], token=token)

    def _held(self, key: str, token: str) -> Row | None:
        row = self.live(key)
        if row is None or row.state is not RecordState.IN_PROGRESS or row.token != token:
            return None
        return row

    def renew(self, key: str, token: str, lease: float) -> bool:
        row = self._held(key, token)
        if row is not None:
            self.rows[key] = replace(row, lease_end=self.now + lease)
        return row is not None

    def complete(self, key: str, token: str, result: bytes, retention: float) -> bool:
        row = self._held(key, token)
        if row is not None:
            self.rows[key] = self._done(row, result, retention)
        return row is not None

    def _done(self, row: Row, result: bytes, retention: float) -> Row:
        return replace(
            row,
            state=RecordState.COMPLETED,
            token=None,
            lease_end=None,
            completed_at=self.now,
            expires=self.now + retention,
            result=result,
        )

    def _released(self, row: Row, retention: float) -> Row:
        return replace(
            row,
            state=RecordState.RELEASED,
            token=None,
            lease_end=None,
            expires=self.now + retention,
            result=None,
        )

    def release(self, key: str, token: str) -> bool:
        row = self._held(key, token)
        if row is not None:
            self.rows[key] = self._released(row, self.orphan)
        return row is not None

    def settle(self, key: str, result: bytes | None, retention: float) -> bool:
        row = self.live(key)
        if row is None or row.state is not RecordState.UNKNOWN:
            return False
        if result is None:
            self.rows[key] = self._released(row, retention)
        else:
            self.rows[key] = self._done(row, result, retention)
        return True

    def purge(self) -> int:
        gone = [key for key in self.rows if self.live(key) is None]
        for key in gone:
            row = self.rows.pop(key)
            assert row.expires is not None
            self.fences[key] = (row.fence, row.expires)
        return len(gone)


# -- driving a real store ------------------------------------------------------------------------


def outcome_fields(status: str, outcome: ClaimOutcome) -> dict[str, Any]:
    """The fields the protocol documents for `status`, as the model states them."""
    if status == "claimed":
        return {
            "fence": outcome.fence,
            "attempts": outcome.attempts,
            "took_over": outcome.took_over,
        }
    if status == "replay":
        return {
            "fence": outcome.fence,
            "attempts": outcome.attempts,
            "result": outcome.result,
            "completed_at": outcome.completed_at,
        }
    if status == "busy":
        return {"retry_after": outcome.retry_after}
    return {}


def same(expected: object, actual: object, tolerance: float) -> bool:
    if isinstance(expected, float) and isinstance(actual, float):
        return abs(expected - actual) <= tolerance
    return expected == actual


@pytest.fixture(scope="module")
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal("asyncio") as running:
        yield running


BACKENDS = [
    "memory",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=[pytest.mark.redis, pytest.mark.slow]),
    pytest.param("redis-sentinel", marks=pytest.mark.redis),
]
#: Through Sentinel the model runs shorter: the store code is the same, only discovery differs.
EXAMPLES = {"memory": 150, "sqlite": 50, "redis": 50, "redis-cluster": 50, "redis-sentinel": 15}
#: Where each Redis backend's URL comes from.
URL_FIXTURES = {
    "redis": "redis_url",
    "redis-cluster": "redis_cluster_url",
    "redis-sentinel": "redis_sentinel_url",
}


@pytest.mark.parametrize("name", BACKENDS)
def test_backend_matches_the_reference_model(
    name: str, portal: BlockingPortal, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    on_redis = name in URL_FIXTURES
    redis_url = request.getfixturevalue(URL_FIXTURES[name]) if on_redis else ""
    databases = iter(range(1_000_000))

    def fresh() -> Backend:
        if name == "memory":
            return make_memory(orphan_retention=ORPHAN)
        if name == "sqlite":
            return make_sqlite(tmp_path / f"model-{next(databases)}.db", orphan_retention=ORPHAN)
        make = make_redis_sentinel if name == "redis-sentinel" else make_redis
        return make(redis_url, f"m{uuid.uuid4().hex[:12]}", orphan_retention=ORPHAN)

    # Real time moves under Redis's clock; everything else runs on an exact fake clock.
    tolerance = DRIFT if on_redis else 1e-6

    class StoreMatchesModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.backend = portal.call(_async(fresh))
            self.model = Model(EPOCH, ORPHAN)
            self.tokens: dict[str, list[str]] = {"a": [], "b": []}
            #: Redis's clock is its own: learn its distance from the model's at the first claim.
            self.skew: float | None = None if on_redis else 0.0

        def call(self, make: Callable[[], Awaitable[T]]) -> T:
            return portal.call(make)

        def token(self, key: str, age: int) -> str:
            issued = self.tokens[key]
            return issued[-1 - age] if age < len(issued) else f"forged-{age}"

        def at(self, model_time: float | None) -> float | None:
            if model_time is None or self.skew is None:
                return model_time
            return model_time + self.skew

        def check(self, what: str, expected: object, actual: object) -> None:
            assert same(expected, actual, tolerance), (
                f"{what}: model {expected!r}, store {actual!r}"
            )

        @rule(key=KEYS, fp=FINGERPRINTS, lease=LEASES, takeover=st.booleans())
        def claim(self, key: str, fp: str, lease: int, takeover: bool) -> None:
            store = self.backend.store
            outcome = self.call(
                functools.partial(store.claim, key, fp, lease=lease, takeover=takeover)
            )
            status, fields = self.model.claim(key, fp, lease, takeover)
            event(f"claim: {status}" + (" (took over)" if fields.get("took_over") else ""))
            assert outcome.status == ClaimStatus(status), (status, outcome)
            if status == "claimed":
                assert outcome.token and outcome.token not in self.tokens[key]
                self.tokens[key].append(outcome.token)
                self.model.adopt(key, outcome.token)
                if self.skew is None:
                    record = self.call(functools.partial(store.get, key))
                    assert record is not None and record.lease_deadline is not None
                    self.skew = record.lease_deadline - (self.model.now + lease)
            else:
                assert outcome.token is None
            if "completed_at" in fields:
                fields["completed_at"] = self.at(fields["completed_at"])
            actual = outcome_fields(status, outcome)
            for field_name, expected in fields.items():
                self.check(f"claim {status} {field_name}", expected, actual[field_name])

        # Claims and completions move records through their states: they get two turns each.
        @rule(key=KEYS, fp=FINGERPRINTS, lease=LEASES, takeover=st.booleans())
        def claim_again(self, key: str, fp: str, lease: int, takeover: bool) -> None:
            self.claim(key, fp, lease, takeover)

        @rule(key=KEYS, age=TOKEN_AGE, lease=LEASES)
        def renew(self, key: str, age: int, lease: int) -> None:
            token = self.token(key, age)
            done = self.call(functools.partial(self.backend.store.renew, key, token, lease=lease))
            self.check("renew", self.model.renew(key, token, lease), done)

        @rule(key=KEYS, age=TOKEN_AGE, result=RESULTS, retention=RETENTIONS)
        def complete(self, key: str, age: int, result: bytes, retention: int) -> None:
            token = self.token(key, age)
            store = self.backend.store
            done = self.call(
                functools.partial(store.complete, key, token, result, retention=retention)
            )
            self.check("complete", self.model.complete(key, token, result, retention), done)

        @rule(key=KEYS, result=RESULTS, retention=RETENTIONS)
        def complete_again(self, key: str, result: bytes, retention: int) -> None:
            self.complete(key, 0, result, retention)

        @rule(key=KEYS, age=TOKEN_AGE)
        def release(self, key: str, age: int) -> None:
            token = self.token(key, age)
            done = self.call(functools.partial(self.backend.store.release, key, token))
            self.check("release", self.model.release(key, token), done)

        @rule(key=KEYS, result=st.none() | RESULTS, retention=RETENTIONS)
        def settle(self, key: str, result: bytes | None, retention: int) -> None:
            store = self.backend.store
            done = self.call(
                functools.partial(store.settle, key, result=result, retention=retention)
            )
            expected = self.model.settle(key, result, retention)
            event(f"settle: {expected} ({'result' if result is not None else 'none'})")
            self.check("settle", expected, done)

        # An operator settles what is UNKNOWN: rare by chance, so it gets its own turn then.
        @precondition(lambda self: self.unknown_keys())
        @rule(data=st.data(), result=st.none() | RESULTS, retention=RETENTIONS)
        def settle_unknown(self, data: st.DataObject, result: bytes | None, retention: int) -> None:
            self.settle(data.draw(st.sampled_from(self.unknown_keys())), result, retention)

        def unknown_keys(self) -> list[str]:
            return [
                key
                for key in ("a", "b")
                if (row := self.model.live(key)) and row.state is RecordState.UNKNOWN
            ]

        @rule(seconds=STEPS)
        def advance(self, seconds: int) -> None:
            self.call(functools.partial(self.backend.advance, seconds))
            self.model.now += seconds

        @rule()
        def purge(self) -> None:
            expected = self.model.purge()
            event(f"purge: {'some' if expected else 'none'}")
            self.check("purge", expected, self.call(self.backend.store.purge_expired))

        @invariant()
        def records_match(self) -> None:
            if not hasattr(self, "backend"):
                return
            store = self.backend.store
            for key in ("a", "b"):
                expected = self.model.visible(key)
                actual = self.call(functools.partial(store.get, key))
                self.compare_record(key, expected, actual)
            listed = self.call(store.list_records)
            assert sorted(r.key for r in listed) == [
                key for key in ("a", "b") if self.model.visible(key) is not None
            ]
            for state in (RecordState.IN_PROGRESS, RecordState.COMPLETED, RecordState.UNKNOWN):
                listed = self.call(functools.partial(store.list_records, state=state))
                wanted = [
                    k for k in ("a", "b") if (r := self.model.visible(k)) and r.state is state
                ]
                assert sorted(r.key for r in listed) == wanted, state

        def compare_record(self, key: str, expected: Row | None, actual: Record | None) -> None:
            if expected is None:
                assert actual is None, f"{key}: the model has no record, the store has {actual}"
                return
            assert actual is not None, f"{key}: the model has {expected}, the store none"
            assert actual.key == key
            pairs = {
                "state": (expected.state, actual.state),
                "fingerprint": (expected.fingerprint, actual.fingerprint),
                "fence": (expected.fence, actual.fence),
                "attempts": (expected.attempts, actual.attempts),
                "token": (expected.token, actual.token),
                "result": (expected.result, actual.result),
                "completed_at": (self.at(expected.completed_at), actual.completed_at),
                "expires_at": (self.at(expected.expires), actual.expires_at),
            }
            if expected.state is RecordState.IN_PROGRESS:
                pairs["lease_deadline"] = (self.at(expected.lease_end), actual.lease_deadline)
            for field_name, (want, got) in pairs.items():
                self.check(f"{key}.{field_name}", want, got)

        def teardown(self) -> None:
            if hasattr(self, "backend"):
                portal.call(self.backend.close)

    run_state_machine_as_test(
        StoreMatchesModel,
        settings=settings(
            max_examples=EXAMPLES[name],
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )


def _async(make: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    """Run a constructor inside the portal's event loop (Redis clients bind to the loop)."""

    async def made() -> T:
        return make()

    return made
