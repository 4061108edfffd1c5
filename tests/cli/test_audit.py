"""`mcp-once keys history`, `mcp-once audit [--since --tool --event --follow --json]`, `mcp-once
audit verify` and `keys settle --by --reason`, on a SQLite store a real guarded tool wrote.

The CLI runs in-process (`cli_run.cli`); the one test through a shell pipe (`| head`) runs the
console script and sits in the full tier (its name says so).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import time
from pathlib import Path

import anyio
import pytest
from cli_run import cli
from fake_clock import FakeClock
from mcp import MCPError
from mcp.client import Client
from mcp.server.mcpserver import MCPServer

from idempotency import (
    CallScope,
    SQLiteKeyStore,
    default_scope,
    idempotent,
    store_key,
    wire,
)
from mcp_once._cli import _audit

pytestmark = pytest.mark.anyio

SERVER = "shop"
SECRET = "card-SENTINEL-4242"


class Refused(Exception):
    """Declared effect-free: the tool raises it before any effect."""


def record_of(tool: str, key: str) -> str:
    scope = default_scope(
        CallScope(server=SERVER, tool=tool, principal=None, meta=None, request=None)
    )
    return store_key(scope, tool, key)


async def guarded_calls(path: Path, name: str = SERVER) -> None:
    """A charge run, then replayed twice; a refusal that releases its claim: on server `name`."""
    store = SQLiteKeyStore(path)
    server = MCPServer(name)

    @server.tool()
    @idempotent(store, effect_free=Refused)
    async def charge(card: str, cents: int) -> str:
        return f"charged {cents} to {card}"

    @server.tool()
    @idempotent(store, effect_free=Refused)
    async def ship(card: str) -> str:
        raise Refused(card)

    async with Client(server) as client:
        meta = {wire.KEY_META: "order-1"}
        for _ in range(3):
            await client.call_tool("charge", {"card": SECRET, "cents": 500}, meta=meta)
        # Refused is declared effect-free: the claim is released, the error goes back.
        with contextlib.suppress(MCPError):
            await client.call_tool("ship", {"card": SECRET}, meta={wire.KEY_META: "order-2"})
    await store.aclose()


@pytest.fixture
async def store_url(tmp_path: Path) -> str:
    path = tmp_path / "keys.db"
    await guarded_calls(path)
    return f"sqlite:///{path}"


async def test_keys_history_tells_a_guarded_calls_story(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    record = record_of("charge", "order-1")
    shown = await cli(capsys, "keys", "history", record, "--store", store_url)
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert lines[0].split()[:5] == ["AT", "EVENT", "FENCE", "ATTEMPT", "DETAILS"]
    assert [line.split()[1] for line in lines[1:]] == ["claimed", "completed", "replayed"]
    as_json = await cli(capsys, "keys", "history", record, "--store", store_url, "--json")
    events = as_json.json()
    assert [e["event"] for e in events] == ["claimed", "completed", "replayed"]
    assert events[0]["scope"]  # a digest of the caller's scope
    assert events[2]["count"] == "2"
    released = await cli(
        capsys, "keys", "history", record_of("ship", "order-2"), "--store", store_url, "--json"
    )
    assert [(e["event"], e.get("why")) for e in released.json()] == [
        ("claimed", None),
        ("released", "effect_free"),
    ]


async def test_the_history_of_a_record_that_is_not_there_is_an_error(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not "written before histories were kept" (tests/cli/test_no_silent_all_clear.py)."""
    ran = await cli(capsys, "keys", "history", "0" * 64, "--store", store_url, "--json")
    assert (ran.code, ran.out) == (1, "")
    assert f"no record {'0' * 64} in the key store at" in ran.err


async def test_audit_lists_filters_and_never_shows_a_value(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    everything = await cli(capsys, "audit", "--store", store_url, "--json")
    assert everything.code == 0, everything.err
    entries = [json.loads(line) for line in everything.out.splitlines()]
    assert [(e["tool"], e["event"]) for e in entries] == [
        ("charge", "claimed"),
        ("charge", "completed"),
        ("charge", "replayed"),
        ("charge", "replayed"),
        ("ship", "claimed"),
        ("ship", "released"),
    ]
    assert all(e["record"] == record_of(e["tool"], f"order-{1 if e['tool'] == 'charge' else 2}")
               for e in entries)  # fmt: skip
    assert SECRET not in everything.out and "charged 500" not in everything.out
    only = await cli(capsys, "audit", "--store", store_url, "--tool", "ship", "--event", "released")
    assert [line.split()[3] for line in only.out.splitlines()[1:]] == ["released"]
    future = await cli(capsys, "audit", "--store", store_url, "--since", "2999-01-01T00:00:00Z")
    assert future.code == 0 and future.out == ""
    recent = await cli(capsys, "audit", "--store", store_url, "--since", "1h", "--json")
    assert len(recent.out.splitlines()) == len(entries)
    bad = await cli(capsys, "audit", "--store", store_url, "--event", "exploded")
    assert bad.code == 2


async def test_audit_verify_passes_then_names_the_changed_event(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ok = await cli(capsys, "audit", "verify", "--store", store_url)
    assert ok.code == 0, ok.err
    assert "verified 2 histories" in ok.out
    path = store_url.removeprefix("sqlite:///")
    record = record_of("charge", "order-1")
    with sqlite3.connect(path) as conn:
        (lines,) = conn.execute("SELECT lines FROM history WHERE key = ?", (record,)).fetchone()
        second = lines.split("\n")[1]
        size = second.split("|")[4]  # s=NN,d=NN of the completed event
        changed = lines.replace(size, size.replace("s=", "s=1", 1), 1)
        conn.execute("UPDATE history SET lines = ? WHERE key = ?", (changed, record))
    broken = await cli(capsys, "audit", "verify", "--store", store_url)
    assert broken.code == 1
    assert f"record {record}: event 1 (completed" in broken.err


async def test_keys_settle_records_by_and_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.db"
    store = SQLiteKeyStore(path)
    record = "ab" * 32
    await store.claim(record, "fp", lease=0.01, takeover=False, tool="charge")
    await anyio.sleep(0.05)
    await store.aclose()
    url = f"sqlite:///{path}"
    settled = await cli(
        capsys, "keys", "settle", record, "--failed", "--force", "--reason", "PSP shows no charge",
        "--store", url,
    )  # fmt: skip
    assert settled.code == 0, settled.err
    events = (await cli(capsys, "keys", "history", record, "--store", url, "--json")).json()
    assert [e["event"] for e in events] == ["claimed", "lease ran out", "settled"]
    assert events[-1]["by"] == _audit.operator()
    assert events[-1]["reason"] == "PSP shows no charge"
    assert events[-1]["answer"] == "failed"
    assert "@" in _audit.operator()


async def test_audit_into_head_exits_quietly_through_the_console_script(
    store_url: str, tmp_path: Path
) -> None:
    script = Path(sys.executable).with_name("mcp-once")
    env = {**os.environ, "MCP_ONCE_STORE": store_url}
    line = f"'{script}' audit --json | head -1; echo \"status ${{PIPESTATUS[0]}}\""
    with anyio.fail_after(60):
        ran = await anyio.run_process(["bash", "-c", line], env=env, cwd=tmp_path, check=False)
    assert ran.stderr == b""
    first, status = ran.stdout.decode().splitlines()
    assert json.loads(first)["event"] == "claimed"
    assert status in ("status 0", "status 141")


async def test_audit_entries_export_as_opentelemetry_log_records(store_url: str) -> None:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

    from idempotency import export_audit_logs, open_store

    exporter = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    store = open_store(store_url)
    try:
        assert isinstance(store, SQLiteKeyStore)
        entries = await store.audit()
    finally:
        await store.aclose()
    assert export_audit_logs(entries, provider.get_logger("test")) == len(entries)
    records = [data.log_record for data in exporter.get_finished_logs()]
    assert [r.attributes["mcp_once.event"] for r in records if r.attributes] == [
        e.event.kind for e in entries
    ]
    completed = next(
        r for r in records if r.attributes and r.attributes["mcp_once.event"] == "completed"
    )
    assert completed.attributes is not None
    assert completed.attributes["gen_ai.tool.name"] == "charge"
    assert completed.attributes["mcp_once.record"] == record_of("charge", "order-1")
    assert "mcp_once.result_bytes" in completed.attributes
    assert SECRET not in repr([dict(r.attributes or {}) for r in records])


# -- rule 25: records know their server ---------------------------------------------------------


async def depot_calls(path: Path) -> None:
    """A second server, "depot", on the same store, with tools of the same names under the
    same client keys: other records (the scope holds the server's name)."""
    await guarded_calls(path, "depot")


def depot_record(tool: str, key: str) -> str:
    scope = default_scope(CallScope("depot", tool, None, None, None))
    return store_key(scope, tool, key)


async def test_list_show_history_and_audit_show_and_filter_by_server(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await depot_calls(Path(store_url.removeprefix("sqlite:///")))
    shop, depot = record_of("charge", "order-1"), depot_record("charge", "order-1")
    store = ("--store", store_url)

    listed = await cli(capsys, "keys", "list", "--json", *store)
    assert {(r["key"], r["server"]) for r in listed.json()} == {(shop, SERVER), (depot, "depot")}
    only = await cli(capsys, "keys", "list", "--server", "depot", *store)
    lines = only.out.splitlines()
    # The last two columns: server, then principal ("-": no authentication).
    assert lines[0].split()[-2:] == ["server", "principal"]
    assert lines[-1] == "(1 record, oldest first)"
    assert lines[1].split()[0] == depot and lines[1].split()[-2:] == ["depot", "-"]
    limited = await cli(
        capsys, "keys", "list", "--server", "depot", "--limit", "1", "--json", *store
    )
    assert [r["key"] for r in limited.json()] == [depot]  # the first of depot's, not of all
    none = await cli(capsys, "keys", "list", "--server", "nowhere", "--json", *store)
    assert none.code == 0 and none.json() == []

    shown = await cli(capsys, "keys", "show", depot, "--json", *store)
    assert shown.json()["server"] == "depot"
    checked = await cli(capsys, "keys", "show", depot, "--server", "depot", *store)
    assert checked.code == 0 and "server: depot" in checked.out.splitlines()
    refused = await cli(capsys, "keys", "history", shop, "--server", "depot", *store)
    assert refused.code == 1 and refused.out == ""
    assert f"record {shop} is not server 'depot''s: its history names server 'shop'" in refused.err
    history = await cli(capsys, "keys", "history", depot, "--json", *store)
    assert [(e["event"], e.get("server")) for e in history.json()] == [
        ("claimed", "depot"),
        ("completed", None),
        ("replayed", None),
    ]

    audit = await cli(capsys, "audit", "--server", "depot", "--json", *store)
    entries = [json.loads(line) for line in audit.out.splitlines()]
    assert [(e["record"], e["event"], e["server"]) for e in entries] == [
        (depot, "claimed", "depot"),
        (depot, "completed", "depot"),
        (depot, "replayed", "depot"),
        (depot, "replayed", "depot"),
        (depot_record("ship", "order-2"), "claimed", "depot"),
        (depot_record("ship", "order-2"), "released", "depot"),
    ]
    table = await cli(capsys, "audit", "--server", SERVER, "--tool", "ship", *store)
    rows = [line.split() for line in table.out.splitlines()]
    assert rows[0][:8] == ["AT", "RECORD", "TOOL", "EVENT", "FENCE", "ATTEMPT", "SERVER", "DETAILS"]
    assert [(row[3], row[6]) for row in rows[1:]] == [("claimed", SERVER), ("released", SERVER)]
    assert SECRET not in audit.out + table.out + listed.out + shown.out


async def test_a_client_key_without_its_server_names_the_servers_holding_a_record(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The client saw its key and the tool; two servers hold a record for them. Without
    --server, or with a wrong one, show, history and settle name both (and their store keys)
    and do nothing else."""
    await depot_calls(Path(store_url.removeprefix("sqlite:///")))
    shop, depot = record_of("charge", "order-1"), depot_record("charge", "order-1")
    client = ("--client-key", "order-1", "--tool", "charge", "--store", store_url)
    named = f"server 'depot': store key {depot}; server 'shop': store key {shop}"
    for argv in (
        ["keys", "show", *client],
        ["keys", "history", *client],
        ["keys", "settle", *client, "--failed", "--force"],
    ):
        ran = await cli(capsys, *argv)
        assert ran.code == 1 and ran.out == "", (argv, ran)
        assert "give --server, the MCP server's own name" in ran.err, argv
        assert f"records for this --client-key and --tool 'charge': {named}" in ran.err, argv
    wrong = await cli(capsys, "keys", "show", *client, "--server", "shipping")
    assert wrong.code == 1
    assert f"(server 'shipping') in the key store at {store_url!r}; records for" in wrong.err
    assert named in wrong.err
    unheld = await cli(capsys, "keys", "show", *client[:2], "--tool", "refund", *client[4:])
    assert unheld.code == 1
    assert "no server holds a record for this --client-key and --tool 'refund'" in unheld.err
    right = await cli(capsys, "keys", "show", *client, "--server", "depot", "--json")
    assert right.code == 0 and right.json()["key"] == depot
    store = SQLiteKeyStore(Path(store_url.removeprefix("sqlite:///")))
    try:
        states = [(await store.get(key)) for key in (shop, depot)]
    finally:
        await store.aclose()
    assert [r.state.value if r else None for r in states] == ["completed", "completed"]


async def test_audit_event_takes_the_snake_case_names_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--event lease_ran_out` (what a script writes) is `--event "lease ran out"`."""
    path = tmp_path / "keys.db"
    clock = FakeClock(time.time())
    store = SQLiteKeyStore(path, clock=clock)
    record = "cd" * 32
    await store.claim(record, "fp", lease=30, takeover=False, tool="charge")
    clock.advance(31)  # its worker died: the next claim finds the lease run out
    await store.claim(record, "fp", lease=30, takeover=False, tool="charge")
    await store.aclose()
    url = f"sqlite:///{path}"
    found = {}
    for spelled in ("lease_ran_out", "lease ran out"):
        ran = await cli(capsys, "audit", "--event", spelled, "--json", "--store", url)
        assert ran.code == 0, ran.err
        found[spelled] = [(e["record"], e["event"]) for e in map(json.loads, ran.out.splitlines())]
    assert found["lease_ran_out"] == found["lease ran out"] == [(record, "lease ran out")]
    claimed = await cli(capsys, "audit", "--event", "claimed", "--json", "--store", url)
    assert len(claimed.out.splitlines()) == 1
    for wrong in ("lease-ran-out", "Lease_Ran_Out"):
        refused = await cli(capsys, "audit", "--event", wrong, "--store", url)
        assert refused.code == 2 and "invalid choice" in refused.err
