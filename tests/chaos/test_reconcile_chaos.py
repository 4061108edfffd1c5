"""Rule 19 under process chaos: three HTTP replicas of the workload shop on one Redis, the wire
faulted, one replica frozen (SIGSTOP) mid-tool past its lease and thawed, another SIGKILLed
mid-tool for good. `pay` (never safe to run twice) is reconciled with the ledger (the payment
made under the in-doubt record, as a provider is asked by its idempotency key).

The same seed runs twice, without `reconcile=` and with it. Checked for both: no duplicate, no
lost result (`check`). Measured and printed: the `pay` records left in doubt (UNKNOWN, or
IN_PROGRESS with nobody running them) after the run; with `reconcile=`, then after one sweep of
`reconcile_unknown` (what `mcp-once keys reconcile` runs) over what no retry reached: none.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from redis_server import RedisServer, redis_server_binary  # tests/ is on sys.path (conftest)

from idempotency import RecordState, open_store, reconcile_unknown
from mcp_once.scenarios import Ledger, check, default_plan, default_policy, open_replicas
from mcp_once.scenarios import run_workload as run_calls
from mcp_once.scenarios._shop import build_server

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

needs_redis_server = pytest.mark.skipif(
    redis_server_binary() is None, reason="redis-server is not on PATH"
)

LEASE = 3.0
TOOL_TIME = 0.2
CALLS = 150


@dataclass
class Outcome:
    duplicates: int
    outcome_unknown: int
    pay_in_doubt: int
    pay_in_doubt_after_sweep: int
    swept: dict[str, int]
    #: The reconciler's questions (the ledger's events), by answer.
    answered: dict[str, int]


async def pay_in_doubt(url: str) -> int:
    store = open_store(url)
    try:
        records = await store.list_records(limit=1_000_000)
    finally:
        await store.aclose()
    doubtful = (RecordState.UNKNOWN, RecordState.IN_PROGRESS)
    return sum(1 for r in records if r.tool == "pay" and r.state in doubtful)


async def chaos_run(tmp_path: Path, seed: int, *, reconcile: bool) -> Outcome:
    ledger = Ledger(tmp_path / f"ledger-{reconcile}.sqlite3")
    with RedisServer(appendonly=True) as redis:
        async with open_replicas(
            ledger,
            redis.url,
            replicas=3,
            lease=LEASE,
            wait=10.0,
            hold=TOOL_TIME,
            reconcile=reconcile,
        ) as replicas:
            frozen, killed = replicas.pids()[0], replicas.pids()[1]

            async def freeze() -> None:
                await ledger.next_event("started", pid=frozen, timeout=30.0)
                await replicas.freeze(0)
                await anyio.sleep(LEASE + 1)  # the pause outlasts the lease
                await replicas.thaw(0)

            async def kill() -> None:
                await ledger.next_event("started", pid=killed, timeout=30.0)
                await replicas.kill(1)

            run = await run_calls(
                replicas,
                mode="mcp-once",
                ledger=ledger,
                plan=default_plan(scale=0.5),
                seed=seed,
                calls=CALLS,
                policy=default_policy(attempt_timeout=1.0),
                concurrency=4,
                actions={30: freeze, 80: kill},
            )
            run.extra_faults.update(frozen_replica=1, killed_replica=1)
            report = check(run)
        assert report.ok and report.problems == [] and report.unexplained == 0, report.summary()
        left = await pay_in_doubt(redis.url)
        swept: dict[str, int] = {}
        if reconcile:
            # The app object of the replicas' own code, as `keys reconcile --app` imports it.
            store = open_store(redis.url)
            try:
                app = build_server(store, ledger, lease=LEASE, reconcile=True)
                for done in await reconcile_unknown(app, store, tool="pay"):
                    swept[done.answer] = swept.get(done.answer, 0) + 1
            finally:
                await store.aclose()
        after = await pay_in_doubt(redis.url)
    answered = {
        "happened": len(ledger.events("reconciled")),
        "not_happened": len(ledger.events("reconciled_absent")),
    }
    return Outcome(report.duplicates, report.outcome_unknown, left, after, swept, answered)


@needs_redis_server
@pytest.mark.parametrize("seed", [23, 31])
async def test_reconcile_leaves_no_payment_in_doubt_under_process_chaos(
    tmp_path: Path, seed: int
) -> None:
    plain = await chaos_run(tmp_path, seed, reconcile=False)
    reconciled = await chaos_run(tmp_path, seed, reconcile=True)
    print(
        f"[reconcile chaos] seed {seed}, {CALLS} calls, 3 replicas (one frozen, one killed):"
        f" without reconcile= {plain.pay_in_doubt} pay record(s) left in doubt,"
        f" {plain.outcome_unknown} OutcomeUnknown, {plain.duplicates} duplicates; with it"
        f" reconciliations {reconciled.answered}, {reconciled.pay_in_doubt} left after the run,"
        f" {reconciled.pay_in_doubt_after_sweep} after one keys-reconcile sweep"
        f" ({reconciled.swept}), {reconciled.outcome_unknown} OutcomeUnknown,"
        f" {reconciled.duplicates} duplicates"
    )
    assert plain.duplicates == reconciled.duplicates == 0
    assert reconciled.pay_in_doubt_after_sweep == 0
    assert reconciled.pay_in_doubt <= plain.pay_in_doubt
