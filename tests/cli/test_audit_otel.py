"""`mcp-once audit --follow --otel`: the audit stream as OpenTelemetry log records, as it arrives.

Issue 37 asks for the audit stream "exported as OpenTelemetry log records with the same fields, for
a SIEM". The events are written by the store itself (in the transition's own SQLite transaction,
or Lua script on Redis), so no server process sees them go by; they are exported where they are
read, by one follower per store (docs/observability.md). Here a real SDK `LoggerProvider`
(the process's, with an in-memory exporter, as `opentelemetry-instrument` would configure one)
receives what the follower exports while a guarded tool keeps writing events, on SQLite and on
Redis: every event, those written before it started and those written while it followed, each
once, with exactly the fields `audit --json` prints, and never an argument or a result.

The follower is the command's own action on the arguments its own parser makes, run in this
event loop so that the test can stop it (as Ctrl-C does) once it has seen every event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_run import cli, private_redis_server
from mcp.client import Client
from mcp.server.mcpserver import MCPServer
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from otel_logs import log_recorder

from idempotency import (
    AuditEntry,
    MemoryKeyStore,
    export_audit_logs,
    idempotent,
    open_store,
    parse_history,
    wire,
)
from mcp_once._cli import _audit, build_parser

pytestmark = pytest.mark.anyio

SECRET = "card-SENTINEL-9137"
#: Events per order: claimed, completed, replayed.
EVENTS_PER_ORDER = 3


@pytest.fixture(params=["sqlite", "redis", "redis-stream"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """SQLite; Redis with its audit trail read from the histories (the default) and from the
    audit stream (`audit_stream=true`)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'keys.db'}"
        return
    for server in private_redis_server("audit --otel"):
        yield server.url + ("?audit_stream=true" if request.param == "redis-stream" else "")


async def charge(url: str, orders: range) -> None:
    """Each order charged once and its retry replayed, through a guarded tool."""
    store = open_store(url)
    server = MCPServer("shop")

    @server.tool()
    @idempotent(store)
    async def charge(card: str, cents: int) -> str:
        return f"charged {cents} to {card}"

    try:
        async with Client(server) as client:
            for n in orders:
                for _ in range(2):
                    meta = {wire.KEY_META: f"order-{n}"}
                    await client.call_tool("charge", {"card": SECRET, "cents": n}, meta=meta)
    finally:
        await store.aclose()


async def exported(recorder: InMemoryLogRecordExporter, count: int) -> None:
    """Until the follower (another task, on its own schedule) has exported `count` records."""
    with anyio.fail_after(30):
        while len(recorder.get_finished_logs()) < count:  # noqa: ASYNC110
            await anyio.sleep(0.05)


def as_json_fields(data: ReadableLogRecord) -> dict[str, Any]:
    """A log record's fields, under the names `audit --json` gives them."""
    record = data.log_record
    attributes = dict(record.attributes or {})
    fields: dict[str, Any] = {
        "id": attributes.pop("mcp_once.audit.id"),
        "record": attributes.pop("mcp_once.record"),
        "tool": attributes.pop("gen_ai.tool.name", None),
    }
    fields.update({name.removeprefix("mcp_once."): value for name, value in attributes.items()})
    # An updated count's record is timed at the update; the event's first time is an attribute.
    first = fields.pop("at", None)
    fields["at_ms"] = round(first * 1000 if first is not None else (record.timestamp or 0) / 1e6)
    return fields


def json_fields(line: str) -> dict[str, Any]:
    fields: dict[str, Any] = json.loads(line)
    fields["at_ms"] = round(fields.pop("at") * 1000)
    return fields


async def test_audit_follow_otel_exports_every_event_as_it_arrives_with_the_json_fields(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    recorder = log_recorder()
    await charge(store_url, range(1, 3))  # before the follower starts
    args = build_parser().parse_args(
        ["audit", "--follow", "--otel", "--json", "--store", store_url]
    )
    store = open_store(store_url)
    try:
        async with anyio.create_task_group() as follower:
            follower.start_soon(_audit._audit, store, args)
            await exported(recorder, 2 * EVENTS_PER_ORDER)
            await charge(store_url, range(3, 6))  # while it follows
            await exported(recorder, 5 * EVENTS_PER_ORDER)
            follower.cancel_scope.cancel()
    finally:
        await store.aclose()
    followed = [json_fields(line) for line in capsys.readouterr().out.splitlines()]

    listed = await cli(capsys, "audit", "--store", store_url, "--json")
    assert listed.code == 0, listed.err
    entries = [json_fields(line) for line in listed.out.splitlines()]
    assert len(entries) == 5 * EVENTS_PER_ORDER
    records = recorder.get_finished_logs()
    assert [as_json_fields(data) for data in records] == entries == followed
    assert {data.log_record.body for data in records} >= {
        f"completed: record {entries[1]['record']}"
    }
    assert not [data for data in records if SECRET in repr(data.log_record.attributes)]
    assert SECRET not in listed.out


async def test_an_entry_that_anchors_its_chain_exports_its_predecessors_digest() -> None:
    """A history keeps its last events; the first one kept names the digest before it (`prev`
    in `audit --json`), and so does its log record, so a SIEM can check the chain too."""
    store = MemoryKeyStore()
    for _ in range(20):  # claimed, released: 40 events, more than a history keeps
        claimed = await store.claim("k", "fp", lease=30, takeover=False, tool="charge")
        assert claimed.token is not None
        await store.release("k", claimed.token)
    first = parse_history(await store.history("k"))[0]
    assert first.prev  # anchored
    found = AuditEntry("7", "k", "charge", first)
    recorder = log_recorder()
    assert export_audit_logs([found]) == 1
    (data,) = recorder.get_finished_logs()
    assert as_json_fields(data) == json_fields(json.dumps(found.as_json()))


async def test_a_replay_counted_again_exports_a_record_timed_at_the_update() -> None:
    """A replay repeated updates its line in place (a count and the last time). `audit --follow`
    reads the update as it arrives; its log record is timed at the update, not at the first
    replay, and carries the first replay's time as `mcp_once.at`."""
    clock = [1_000.0]
    store = MemoryKeyStore(clock=lambda: clock[0])
    claimed = await store.claim("k", "fp", lease=30, takeover=False, tool="charge")
    assert claimed.token is not None
    assert await store.complete("k", claimed.token, b"done", retention=600)
    for step in (5.0, 7.0):
        clock[0] += step
        replayed = await store.claim("k", "fp", lease=30, takeover=False, tool="charge")
        assert replayed.result == b"done"
    last = parse_history(await store.history("k"))[-1]
    assert (last.kind, last.details["count"]) == ("replayed", "2")
    found = AuditEntry("9", "k", "charge", last)
    recorder = log_recorder()
    assert export_audit_logs([found]) == 1
    (data,) = recorder.get_finished_logs()
    attributes = dict(data.log_record.attributes or {})
    assert data.log_record.timestamp == round(1_012.0 * 1e9)
    assert attributes["mcp_once.at"] == 1_005.0
    assert attributes["mcp_once.last_at"] == "1012.0"
    assert as_json_fields(data) == json_fields(json.dumps(found.as_json()))
