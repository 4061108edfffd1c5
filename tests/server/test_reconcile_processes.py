"""Rule 19 with real processes: the payments server of `examples/reconcile.py` SIGKILLs itself in
the middle of `charge` (before or after the provider charged), is restarted on the same key store
(SQLite, then Redis), and the client retries with the same key.

The ledger is the payment provider (`examples/payment_provider.py`), a process of its own with its
own SQLite file: its charges, and how many charge requests reached it per key, are what the
guarded server cannot fake. Nothing sleeps: the restarted server waits for the dead one's 2 s
lease inside its own bounded wait (10 s).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen
from typing import Any

import anyio
import pytest
from mcp import MCPError
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import CallToolResult
from server_kit import marker, meta

from idempotency import CallScope, RecordState, default_scope, open_store, store_key, wire

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from charge_ledger_server import lines
from payment_provider import ProviderClient  # the example's provider: the tests' ledger
from reconcile import server_params, start_provider

pytestmark = pytest.mark.anyio

#: Process start-up (Python + the SDK) on a loaded 2-core machine can take a few seconds.
STARTUP_BOUND = 120.0
CALL = {"order": "A-1", "cents": 500}


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[str]:
    proc: Popen[str]
    proc, url = start_provider(tmp_path / "charges.db")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait()


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "keys.db")
    url = str(request.getfixturevalue("redis_url"))
    prefix = f"{request.getfixturevalue('redis_namespace')}:"
    return f"{url}{'&' if '?' in url else '?'}prefix={prefix}"


async def killed_mid_charge(store: str, provider: str, die: str, key: str) -> None:
    """A server that dies (SIGKILL, by its own hand) at `die` in a `charge` under `key`."""
    with pytest.raises(Exception) as broke:  # the transport of a dead child
        async with Client(server_params(store, provider, "--die", die)) as client:
            await client.call_tool("charge", CALL, meta=meta(key))
    assert not isinstance(broke.value, AssertionError)


async def unknown_records(store: str) -> int:
    opened = open_store(store)
    try:
        return len(await opened.list_records(state=RecordState.UNKNOWN))
    finally:
        await opened.aclose()


async def test_killed_after_the_charge_the_retry_gets_the_providers_charge(
    store_url: str, provider: str
) -> None:
    with anyio.fail_after(STARTUP_BOUND):
        await killed_mid_charge(store_url, provider, "after-charge", "k-after")
        charges = ProviderClient(provider).charges()
        assert [(c["order"], c["requests"]) for c in charges] == [("A-1", 1)]
        async with Client(server_params(store_url, provider)) as client:
            retry = await client.call_tool("charge", CALL, meta=meta("k-after"))
            again = await client.call_tool("charge", CALL, meta=meta("k-after"))
    assert retry.structured_content == {"charge": charges[0]["id"], "order": "A-1", "amount": 500}
    assert marker(retry)["status"] == "replayed" and marker(retry)[wire.MARKER_RECONCILED]
    assert again.structured_content == retry.structured_content
    # One charge, and no second charge request: the body did not run again.
    assert [(c["id"], c["requests"]) for c in ProviderClient(provider).charges()] == [
        (charges[0]["id"], 1)
    ]
    assert await unknown_records(store_url) == 0


async def test_killed_before_the_charge_the_tool_runs_once(store_url: str, provider: str) -> None:
    with anyio.fail_after(STARTUP_BOUND):
        await killed_mid_charge(store_url, provider, "before-charge", "k-before")
        assert ProviderClient(provider).charges() == []
        async with Client(server_params(store_url, provider)) as client:
            retry = await client.call_tool("charge", CALL, meta=meta("k-before"))
            again = await client.call_tool("charge", CALL, meta=meta("k-before"))
    charges = ProviderClient(provider).charges()
    assert [(c["order"], c["requests"]) for c in charges] == [("A-1", 1)]
    assert retry.structured_content == {"charge": charges[0]["id"], "order": "A-1", "amount": 500}
    assert marker(retry)["status"] == "executed" and marker(retry)["attempts"] == 2
    assert marker(again)["status"] == "replayed"
    assert await unknown_records(store_url) == 0


async def test_without_reconcile_the_retry_gets_outcome_unknown(
    store_url: str, provider: str
) -> None:
    with anyio.fail_after(STARTUP_BOUND):
        await killed_mid_charge(store_url, provider, "after-charge", "k-plain")
        async with Client(server_params(store_url, provider, "--no-reconcile")) as client:
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("charge", CALL, meta=meta("k-plain"))
    assert unknown.value.error.code == wire.OUTCOME_UNKNOWN
    assert [c["requests"] for c in ProviderClient(provider).charges()] == [1]
    assert await unknown_records(store_url) == 1


REPLICA = Path(__file__).with_name("reconcile_replica_server.py")


def replica(store: str, provider: str, *extra: str) -> StdioServerParameters:
    argv = [str(REPLICA), "--store", store, "--provider", provider, *extra]
    return StdioServerParameters(command=sys.executable, args=argv, env=dict(os.environ))


async def test_a_reconciler_paused_past_its_hold_changes_nothing(
    store_url: str, provider: str
) -> None:
    """Replica A claims the in-doubt record to reconcile it and is frozen (SIGSTOP) while asking.
    Its hold runs out; replica B's retry reconciles the record under a higher fence and gets
    the provider's charge. A, resumed, changes nothing: its caller gets B's answer."""
    with anyio.fail_after(STARTUP_BOUND):
        await killed_mid_charge(store_url, provider, "after-charge", "k-paused")
        async with (
            Client(replica(store_url, provider, "--gated")) as a,
            Client(replica(store_url, provider)) as b,
            anyio.create_task_group() as tg,
        ):
            late: list[CallToolResult] = []

            async def a_retries() -> None:
                late.append(await a.call_tool("charge", CALL, meta=meta("k-paused")))

            tg.start_soon(a_retries)
            asked = await a.call_tool("wait_asked", {"count": 1})
            assert asked.structured_content is not None
            pid = int(asked.structured_content["result"])
            os.kill(pid, signal.SIGSTOP)
            try:
                answer = await b.call_tool("charge", CALL, meta=meta("k-paused"))
                settled = await record_of(store_url)
            finally:
                os.kill(pid, signal.SIGCONT)
            await a.call_tool("open_gate")
    assert answer.structured_content is not None
    assert answer.structured_content["charge"] == "ch_1"
    assert marker(answer)[wire.MARKER_RECONCILED] is True
    assert settled is not None and settled.state is RecordState.COMPLETED
    assert settled.fence == 3  # the dead worker's 1, A's hold 2, B's reconciliation 3
    assert await record_of(store_url) == settled  # A's late verdict changed nothing
    assert late and late[0].structured_content == answer.structured_content
    assert [(c["id"], c["requests"]) for c in ProviderClient(provider).charges()] == [("ch_1", 1)]


async def count_asks(client: Client) -> int:
    counted = await client.call_tool("asked_count")
    assert counted.structured_content is not None
    return int(counted.structured_content["result"])


async def record_of(store: str) -> Any:
    opened = open_store(store)
    try:
        records = await opened.list_records()
    finally:
        await opened.aclose()
    assert len(records) == 1
    return records[0]


@pytest.mark.parametrize("die", ["after-charge", "before-charge"])
async def test_two_replicas_retrying_at_once_share_one_reconciliation(
    store_url: str, provider: str, die: str
) -> None:
    """Replica A's retry holds the in-doubt record while its reconciler asks (held until the
    test opens it). Replica B's retry meanwhile finds it held (B does not wait: -32010) and does
    not ask. Once A answers, B's retry gets A's answer. One reconciliation across replicas; a
    not_happened runs the tool once."""
    with anyio.fail_after(STARTUP_BOUND):
        await killed_mid_charge(store_url, provider, die, "k-twice")
        slow = ("--gated", "--reconcile-timeout", "60")
        async with (
            Client(replica(store_url, provider, *slow)) as a,
            Client(replica(store_url, provider, "--wait", "0")) as b,
        ):
            answers: list[CallToolResult] = []

            async def a_retries() -> None:
                answers.append(await a.call_tool("charge", CALL, meta=meta("k-twice")))

            async with anyio.create_task_group() as tg:
                tg.start_soon(a_retries)
                await a.call_tool("wait_asked", {"count": 1})
                with pytest.raises(MCPError) as held:
                    await b.call_tool("charge", CALL, meta=meta("k-twice"))
                await a.call_tool("open_gate")
            answers.append(await b.call_tool("charge", CALL, meta=meta("k-twice")))
            asked = [await count_asks(replica) for replica in (a, b)]
    assert held.value.error.code == wire.IN_PROGRESS  # B found A's reconciliation holding it
    assert asked == [1, 0]  # one reconciliation, on A
    assert len(answers) == 2 and answers[0].structured_content == answers[1].structured_content
    charges = ProviderClient(provider).charges()
    assert [(c["id"], c["requests"]) for c in charges] == [("ch_1", 1)]
    first = marker(answers[0])
    assert first["status"] == ("replayed" if die == "after-charge" else "executed")
    assert marker(answers[1])["status"] == "replayed"
    assert await unknown_records(store_url) == 0


# -- rule 25: two servers, one store -------------------------------------------------------------

LEDGER_SERVER = Path(__file__).with_name("charge_ledger_server.py")
EU, US = "payments-eu", "payments-us"
ORDER = {"order": "B-7", "cents": 900}
APP = """import sys
from pathlib import Path

sys.path.insert(0, {here!r})
from charge_ledger_server import build

from idempotency import open_store

server = build({name!r}, open_store({store!r}), Path({ledger!r}))
"""


def ledger_server(name: str, store: str, ledger: Path, *extra: str) -> StdioServerParameters:
    argv = [str(LEDGER_SERVER), "--name", name, "--store", store, "--ledger", str(ledger), *extra]
    return StdioServerParameters(command=sys.executable, args=argv, env=dict(os.environ))


def record_name(server: str, key: str) -> str:
    scope = default_scope(CallScope(server, "charge", None, None, None))
    return store_key(scope, "charge", key)


async def lease_ran_out(store_url: str, record: str) -> None:
    """Waits (polling the store) until the record's lease is over on this machine's clock."""
    opened = open_store(store_url)
    try:
        while True:
            found = await opened.get(record)
            assert found is not None and found.state is RecordState.IN_PROGRESS
            if found.lease_deadline is not None and found.lease_deadline <= time.time():
                return
            await anyio.sleep(0.05)
    finally:
        await opened.aclose()


async def mcp_once(cwd: Path, *argv: str) -> tuple[int, str, str]:
    """The installed console script, run in `cwd` (where the apps' modules are), as an
    operator runs it."""
    script = Path(sys.executable).with_name("mcp-once")
    ran = await anyio.run_process([str(script), *argv], cwd=cwd, check=False)
    return ran.returncode, ran.stdout.decode(), ran.stderr.decode()


async def test_two_servers_processes_reconcile_asks_each_app_only_about_its_own_record(
    store_url: str, tmp_path: Path
) -> None:
    """Two servers of different names, each with a tool `charge` and a reconciler, on one key
    store (one SQLite file; one Redis prefix). A worker of each is killed (SIGKILL by its own
    hand) right after its effect, under the same client key: two records in doubt. `keys
    reconcile --app` for one asks its reconciler about its own record only (the ledger of
    questions shows one), so the other server's record stays in doubt: its retry gets -32012 and
    does not run. Reconciled with its own app, each history names the operator who asked.
    (Before rule 25 the first app's reconciler was asked about both records, said "not
    happened" about the other one, and released it: that server's retry charged again.)"""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    here = str(LEDGER_SERVER.parent)
    for module, name in (("payments_eu", EU), ("payments_us", US)):
        app = APP.format(here=here, name=name, store=store_url, ledger=str(ledger))
        (tmp_path / f"{module}.py").write_text(app)
    eu, us = record_name(EU, "order-B-7"), record_name(US, "order-B-7")
    with anyio.fail_after(STARTUP_BOUND):
        for name in (EU, US):
            with pytest.raises(Exception) as broke:  # the transport of a dead child
                async with Client(ledger_server(name, store_url, ledger, "--die")) as client:
                    await client.call_tool("charge", ORDER, meta=meta("order-B-7"))
            assert not isinstance(broke.value, AssertionError)
        for record in (eu, us):
            await lease_ran_out(store_url, record)
        assert [lines(ledger / f"{name}.effects") for name in (EU, US)] == [[eu], [us]]

        store = ("--store", store_url)
        dry = await mcp_once(tmp_path, "keys", "reconcile", "--app", "payments_eu:server",
                             "--dry-run", "--json", *store)  # fmt: skip
        assert dry[0] == 0, dry
        assert lines(ledger / "asked") == [f"{EU} {eu}"]  # asked about its own record only
        assert json.loads(dry[1]) == {
            "dryRun": True,
            "records": [
                {
                    "record": eu,
                    "tool": "charge",
                    "server": EU,
                    "answer": "happened",
                    "applied": False,
                },
            ],
            "otherServers": {US: 1},
        }

        done = await mcp_once(tmp_path, "keys", "reconcile", "--app", "payments_eu:server",
                              "--by", "alice@ops", "--reason", "INC-7 sweep", *store)  # fmt: skip
        assert done[0] == 0, done
        assert f"{eu}  {EU}  charge  happened -> completed" in done[1]
        assert f"left alone: in-doubt records of other servers (1 of {US})" in done[1]
        assert lines(ledger / "asked") == [f"{EU} {eu}"] * 2  # the dry run's, then this one's

        # The other server's record was not touched: its retry is still told -32012 and the
        # tool does not run (no reconciler on this replica: the answer is the operator's).
        async with Client(ledger_server(US, store_url, ledger, "--no-reconcile")) as client:
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("charge", ORDER, meta=meta("order-B-7"))
        assert unknown.value.error.code == wire.OUTCOME_UNKNOWN
        assert lines(ledger / f"{US}.effects") == [us]

        wrong = await mcp_once(tmp_path, "keys", "reconcile", "--app", "payments_us:server",
                               "--server", EU, *store)  # fmt: skip
        assert wrong[0] == 2 and f"the app is server {US!r}, not {EU!r}" in wrong[2]
        theirs = await mcp_once(tmp_path, "keys", "reconcile", "--app", "payments_us:server",
                                "--server", US, "--by", "bob@ops", *store)  # fmt: skip
        assert theirs[0] == 0, theirs
        assert lines(ledger / "asked") == [f"{EU} {eu}", f"{EU} {eu}", f"{US} {us}"]
        histories = []
        for record in (eu, us):
            ran = await mcp_once(tmp_path, "keys", "history", record, "--json", *store)
            assert ran[0] == 0, ran
            histories.append(json.loads(ran[1]))
    for events, name, by in ((histories[0], EU, "alice@ops"), (histories[1], US, "bob@ops")):
        claimed = [e for e in events if e["event"] == "claimed"]
        assert {e["server"] for e in claimed} == {name}  # the worker's, the reconciliation's
        [verdict] = [e for e in events if e["event"] == "reconciled"]
        assert (verdict["answer"], verdict["by"]) == ("happened", by)
        assert events[-1]["event"] == "completed"
    assert histories[0][-2]["reason"] == "INC-7 sweep"
    # One effect per server, ever.
    assert [lines(ledger / f"{name}.effects") for name in (EU, US)] == [[eu], [us]]
