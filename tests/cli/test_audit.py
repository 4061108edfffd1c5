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


async def guarded_calls(path: Path) -> None:
    """A charge run, then replayed twice; a refusal that releases its claim."""
    store = SQLiteKeyStore(path)
    server = MCPServer(SERVER)

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
