"""Issue 37's "a key's full story after the process chaos suite", on SQLite and on Redis.

Three HTTP replicas of the workload shop share one store and the wire is faulted; one replica is
frozen (SIGSTOP) mid-tool past its lease and thawed, another SIGKILLed mid-payment for good, and
once the first is back in service the third is SIGKILLed mid-payment too: the thawed one serves
the rest.
Then, with the store the run used, read through the public surface only (the store's `history`
and `list_records`, `mcp-once keys settle`, `audit --json`, `audit verify`), so that the checks
hold whatever the history's encoding:

* every record has a history that starts with its claim; every record left UNKNOWN shows the
  lease that ran out;
* every record left in doubt is settled with `keys settle --by X --reason Y`, and its history
  then ends with the settled event naming X and Y;
* the audit stream holds every record's events (each history event is in it, in order, under
  that record and tool) and nothing else (no record the store does not hold; an entry missing
  from a history only where the history counts repeats in one line);
* a sentinel in the tools' arguments (never stored, by design) appears in no byte of the store,
  and a sentinel in their results appears only in the records' stored results — neither in any
  history or in the audit stream;
* `audit verify` passes afterwards.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
import redis
from cli.cli_run import cli, private_redis_server  # tests/ is on sys.path (conftest)

from idempotency import AuditedStore, Record, RecordState, open_store, parse_history
from mcp_once.scenarios import (
    CallSpec,
    Ledger,
    RunResult,
    check,
    default_plan,
    default_policy,
    open_replicas,
    plan_calls,
    run_workload,
)

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

#: Carried in every effect tool's arguments (`call_id`, `message`), never in a result.
ARGUMENT_SENTINEL = "argsentinel-7f3a9c"
#: Carried in `account`, which `pay` and `get_balance` echo in their results.
RESULT_SENTINEL = "resultsentinel-5b21e0"
LEASE = 3.0
TOOL_TIME = 0.2
CALLS = 120
SEED = 37
#: Events a history counts in one line (a repeat replaces it), each repeat its own audit entry.
COUNTED = frozenset({"replayed", "refused"})


def marked(spec: CallSpec) -> CallSpec:
    """`spec` with the sentinels in its arguments."""
    arguments = dict(spec.arguments)
    call_id = spec.call_id
    if "call_id" in arguments:
        call_id = f"{spec.call_id}-{ARGUMENT_SENTINEL}"
        arguments["call_id"] = call_id
    if "message" in arguments:
        arguments["message"] = f"{arguments['message']} {ARGUMENT_SENTINEL}"
    if "account" in arguments:
        arguments["account"] = f"{arguments['account']}-{RESULT_SENTINEL}"
    return replace(spec, call_id=call_id, arguments=arguments)


@pytest.fixture(params=["sqlite", "redis", "redis-stream"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """SQLite; Redis as it is by default (format 3: each history inside its record, the audit
    trail read from them); and Redis with the audit stream (`audit_stream=true`, issue 45)."""
    if request.param == "sqlite":
        yield f"sqlite:///{(tmp_path / 'keys.sqlite3').resolve()}"
        return
    for server in private_redis_server("history chaos"):  # skipped loudly, failed under CI
        yield server.url + ("?audit_stream=true" if request.param == "redis-stream" else "")


async def chaos_run(ledger: Ledger, url: str, specs: list[CallSpec]) -> RunResult:
    pays = {spec.call_id for spec in specs if spec.tool == "pay"}
    async with open_replicas(ledger, url, replicas=3, lease=LEASE, hold=TOOL_TIME) as replicas:
        pids = replicas.pids()

        async def mid_payment(replica: int) -> None:
            while (await ledger.next_event("started", pid=pids[replica]))[1] not in pays:
                pass

        thawed = anyio.Event()

        def kill(replica: int, after: anyio.Event | None = None) -> Callable[[], Awaitable[None]]:
            async def strike() -> None:
                if after is not None:  # never the last replica in service
                    await after.wait()
                await mid_payment(replica)
                await replicas.kill(replica)

            return strike

        async def freeze() -> None:
            await ledger.next_event("started", pid=pids[0])
            await replicas.freeze(0)
            await anyio.sleep(LEASE + 1)  # the pause outlasts the lease
            await replicas.thaw(0)
            thawed.set()

        run = await run_workload(
            replicas,
            mode="mcp-once",
            ledger=ledger,
            plan=default_plan(scale=0.5),
            seed=SEED,
            calls=specs,
            policy=default_policy(attempt_timeout=1.0),
            concurrency=4,
            actions={10: freeze, 25: kill(1), 45: kill(2, after=thawed)},
        )
    run.extra_faults.update(killed_replica=2, frozen_replica=1)
    return run


async def read_store(url: str) -> tuple[list[Record], dict[str, list[dict[str, object]]]]:
    """Every record, and every history kept (record key: events as `keys history --json`)."""
    store = open_store(url)
    try:
        assert isinstance(store, AuditedStore)
        records = await store.list_records(limit=1_000_000)
        kept = {key: parse_history(text) for key, text in await store.histories()}
    finally:
        await store.aclose()
    return records, {key: [event.as_json() for event in found] for key, found in kept.items()}


def stored_values(url: str) -> list[tuple[str, bytes]]:
    """Every value the store holds, with where it is: each row of each SQLite table (named by
    its table), each Redis key's value (named by the key)."""
    if url.startswith("sqlite:"):
        found: list[tuple[str, bytes]] = []
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            tables = [
                name
                for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            for table in tables:
                if table.startswith("sqlite_"):
                    continue
                for row in conn.execute(f'SELECT * FROM "{table}"'):
                    found.append((table, repr(row).encode()))
        return found
    client = redis.Redis.from_url(url.partition("?")[0])
    try:
        found = []
        for name in client.scan_iter(count=1000):
            kind = client.type(name).decode()
            value: object
            if kind == "string":
                value = client.get(name)
            elif kind == "stream":
                value = client.xrange(name)
            elif kind == "hash":
                value = client.hgetall(name)
            elif kind == "list":
                value = client.lrange(name, 0, -1)
            elif kind == "set":
                value = client.smembers(name)
            else:
                value = client.zrange(name, 0, -1, withscores=True)
            found.append((name.decode(), repr(value).encode()))
        return found
    finally:
        client.close()


def holds_a_result(where: str, records: list[Record]) -> bool:
    """Whether `where` (a SQLite table, a Redis key) is where records keep their results."""
    if "{" not in where:
        return where == "records"
    return any(where.endswith(f"{{{record.key}}}") for record in records)


async def test_every_records_story_after_process_chaos(
    tmp_path: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    specs = [marked(spec) for spec in plan_calls(CALLS, SEED)]
    run = await chaos_run(ledger, store_url, specs)
    report = check(run)
    assert report.ok and report.problems == [] and report.unexplained == 0, report.summary()
    assert any(ARGUMENT_SENTINEL in call_id for call_id in ledger.by_call())  # it was sent

    records, histories = await read_store(store_url)
    assert records and set(histories) == {record.key for record in records}
    for record in records:
        kinds = [event["event"] for event in histories[record.key]]
        assert kinds[0] == "claimed", (record.state, kinds)
    unknown = [record for record in records if record.state is RecordState.UNKNOWN]
    in_doubt = [*unknown, *(r for r in records if r.state is RecordState.IN_PROGRESS)]
    # The two payments killed mid-run (so that both verdicts below are exercised).
    assert len(unknown) >= 2, "the payments killed mid-run left no UNKNOWN record to read"
    for record in unknown:
        lost = [e for e in histories[record.key] if e["event"] == "lease ran out"]
        assert lost and lost[-1]["why"] == "unknown", histories[record.key]

    # Settle every record in doubt, alternately as failed and as done, each by someone else.
    for n, record in enumerate(in_doubt):
        verdict = ["--failed", "--force"] if n % 2 else ["--result-text", f"settled {n}"]
        settled = await cli(
            capsys, "keys", "settle", record.key, *verdict, "--by", f"ops-{n}@chaos",
            "--reason", f"ticket {n}: ledger checked", "--store", store_url,
        )  # fmt: skip
        assert settled.code == 0, settled.err
    for n, record in enumerate(in_doubt):
        shown = await cli(capsys, "keys", "history", record.key, "--store", store_url, "--json")
        events = shown.json()
        assert "lease ran out" in [e["event"] for e in events], events
        last = events[-1]
        assert (last["event"], last["by"], last["reason"], last["answer"]) == (
            "settled",
            f"ops-{n}@chaos",
            f"ticket {n}: ledger checked",
            "failed" if n % 2 else "done",
        )
        assert ARGUMENT_SENTINEL not in shown.out and RESULT_SENTINEL not in shown.out

    # The audit stream: every record's events, and nothing else.
    # Records settled as failed are released (no longer listed); their histories stay.
    tools = {record.key: record.tool for record in records}
    records, histories = await read_store(store_url)
    assert {record.key for record in records} <= set(histories) == set(tools)
    streamed = await cli(capsys, "audit", "--store", store_url, "--json")
    assert streamed.code == 0, streamed.err
    entries = [json.loads(line) for line in streamed.out.splitlines()]
    by_record: dict[str, list[dict[str, object]]] = defaultdict(list)
    for found in entries:
        by_record[str(found["record"])].append(found)
    assert set(by_record) == set(histories)
    for key, told in by_record.items():
        assert {found["tool"] for found in told} == {tools[key]}
        digests = [found["digest"] for found in told]
        kept = [event["digest"] for event in histories[key]]
        at = iter(digests)
        assert all(digest in at for digest in kept), (key, kept, digests)  # in order
        extra = [found["event"] for found in told if found["digest"] not in kept]
        assert set(extra) <= COUNTED, (key, extra)
    assert ARGUMENT_SENTINEL not in streamed.out and RESULT_SENTINEL not in streamed.out
    # A history inside its record (Redis, format 3) sits beside the result: none holds it.
    kept_text = json.dumps(histories)
    assert ARGUMENT_SENTINEL not in kept_text and RESULT_SENTINEL not in kept_text

    # No argument in any byte of the store; a result only where records keep results.
    values = stored_values(store_url)
    assert not [where for where, value in values if ARGUMENT_SENTINEL.encode() in value]
    holding = {where for where, value in values if RESULT_SENTINEL.encode() in value}
    assert holding, "no stored result holds the result sentinel: the dump sees nothing"
    assert all(holds_a_result(where, records) for where in holding), holding

    verified = await cli(capsys, "audit", "verify", "--store", store_url)
    assert verified.code == 0, verified.err
    assert f"verified {len(histories)} histories" in verified.out
    print(
        f"[history chaos {store_url.split(':')[0]}] {report.summary()}; records {len(records)},"
        f" UNKNOWN {len(unknown)}, in doubt settled {len(in_doubt)}, audit entries"
        f" {len(entries)}, store values scanned {len(values)}"
    )
