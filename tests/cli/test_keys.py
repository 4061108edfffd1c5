"""`mcp-once keys list|show|settle|purge` against records a real guarded tool wrote.

Every record here is produced by calling an `@idempotent` tool through a real MCP session; the
UNKNOWN ones by a worker whose lease expires mid-tool (the store's clock moved past it, takeover
off). The CLI runs in-process through `main([...])` (in a worker thread: it runs its own event
loop), and once as the installed console script. Both embedded SQLite and a private Redis.
"""

from __future__ import annotations

import functools
import json
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from cli_run import Ran, cli, private_redis_server, sync_cli
from fake_clock import FakeClock
from mcp import MCPError
from mcp.client import Client
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult
from redis_server import RedisServer, free_port

from idempotency import (
    CallScope,
    KeyStore,
    OutcomeLost,
    RecordState,
    SQLiteKeyStore,
    default_scope,
    idempotent,
    open_store,
    store_key,
    wire,
)
from idempotency._stores.sqlite import sqlite_path_from_url
from mcp_once._cli import _common, _grace
from mcp_once._cli._proxies import Manifest, record

pytestmark = pytest.mark.anyio

SERVER = "shop"
LEASE = 30.0
SOON = 30.0
ARGS = {"order": "o-1", "cents": 500}


# -- the guarded tool and the stores -----------------------------------------------------------


@dataclass
class Effects:
    """How often the charge really happened; `gate` holds the tool mid-execution when cleared."""

    count: int = 0
    started: anyio.Event = field(default_factory=anyio.Event)
    gate: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        self.gate.set()


def shop(store: KeyStore, effects: Effects) -> MCPServer:
    server = MCPServer(SERVER)

    @server.tool()
    @idempotent(store, lease=LEASE)
    async def charge(order: str, cents: int) -> str:
        effects.started.set()
        await effects.gate.wait()
        effects.count += 1
        return f"charged {cents} for {order} (execution {effects.count})"

    @server.tool()
    @idempotent(store, lease=LEASE)
    async def refund(order: str, cents: int) -> str:
        effects.count += 1
        return f"refunded {cents} for {order}"

    return server


@dataclass
class Backend:
    """The store a test server writes to, the URL the CLI reads it through, and its clock."""

    name: str
    url: str
    store: KeyStore
    clock: FakeClock | None = None
    redis: RedisServer | None = None

    def advance(self, seconds: float) -> None:
        """Move the server store's clock (the CLI's clock stays real)."""
        if self.clock is not None:
            self.clock.now += seconds
        else:
            self.store.advance_clock_for_testing(seconds)  # type: ignore[attr-defined]

    def open_later(self, url: str, seconds: float) -> KeyStore:
        """The CLI's store for `url`, its clock `seconds` ahead of the real one."""
        if self.name == "sqlite":
            return SQLiteKeyStore(sqlite_path_from_url(url), clock=lambda: time.time() + seconds)
        opened = open_store(url)
        opened.advance_clock_for_testing(seconds)  # type: ignore[attr-defined]
        return opened

    def raw_count(self) -> int:
        """Records physically present, whatever their state or expiry."""
        if self.name == "sqlite":
            with sqlite3.connect(sqlite_path_from_url(self.url)) as conn:
                count: int = conn.execute("SELECT count(*) FROM records").fetchone()[0]
            return count
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            # Records only: their histories (`:h`) and the audit stream (rule 20) are not.
            names = list(client.scan_iter())
            return sum(1 for n in names if n.endswith(b"}"))
        finally:
            client.close()

    def damage(self, key: str) -> None:
        """Make the record stored under `key` unreadable as ours, from outside the store."""
        if self.name == "sqlite":
            with sqlite3.connect(sqlite_path_from_url(self.url)) as conn:
                changed = conn.execute("UPDATE records SET state = 'banana' WHERE key = ?", (key,))
                assert changed.rowcount == 1
            return
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            assert client.set(f"mcp-once:{{{key}}}", b"not a record", xx=True)
        finally:
            client.close()


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    yield from private_redis_server("keys CLI")


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "sqlite":
        path = tmp_path / "keys.sqlite3"
        clock = FakeClock(time.time())
        made = Backend("sqlite", f"sqlite:///{path}", SQLiteKeyStore(path, clock=clock), clock)
    else:
        redis_server: RedisServer = request.getfixturevalue("private_redis")
        import redis

        client = redis.Redis.from_url(redis_server.url)
        client.flushdb()  # our private server: nothing else lives there
        client.close()
        url = redis_server.url
        made = Backend("redis", url, open_store(url), redis=redis_server)
    try:
        yield made
    finally:
        await made.store.aclose()


# -- running the CLI -----------------------------------------------------------------------------


def record_key(client_key: str, tool: str = "charge") -> str:
    return store_key(default_scope(CallScope(SERVER, tool, None, None, None)), tool, client_key)


def meta(key: str) -> dict[str, Any]:
    return {wire.KEY_META: key}


def marker(result: CallToolResult) -> dict[str, Any]:
    found = (result.meta or {}).get(wire.IDEMPOTENCY_META)
    assert isinstance(found, dict)
    return found


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert block.type == "text"
    return block.text


async def make_unknown(client: Client, backend: Backend, effects: Effects, key: str) -> None:
    """A worker whose lease expires mid-charge: the next attempt finds the record UNKNOWN.

    The first attempt holds inside the tool; the store's clock moves past its lease; a retry
    with the same key turns the record UNKNOWN (the tool is not declared safe to re-run). The
    stale worker then finishes its effect, and its late completion is refused.
    """
    effects.gate = anyio.Event()
    effects.started = anyio.Event()
    outcomes: list[int] = []

    async def first_attempt() -> None:
        with pytest.raises(MCPError) as stale:
            await client.call_tool("charge", ARGS, meta=meta(key))
        outcomes.append(stale.value.code)

    with anyio.fail_after(SOON):
        async with anyio.create_task_group() as tg:
            tg.start_soon(first_attempt)
            await effects.started.wait()
            backend.advance(LEASE + 1)
            with pytest.raises(MCPError) as retry:
                await client.call_tool("charge", ARGS, meta=meta(key))
            assert retry.value.code == wire.OUTCOME_UNKNOWN
            effects.gate.set()
    assert outcomes == [wire.OUTCOME_UNKNOWN]


def derive_args(client_key: str) -> list[str]:
    return ["--client-key", client_key, "--tool", "charge", "--server", SERVER]


def operator_clock(monkeypatch: pytest.MonkeyPatch, ahead: float) -> None:
    """The CLI's clock `ahead` seconds past the real one: the operator looks later, as the
    server store's clock moved in `make_unknown` (nothing sleeps)."""
    monkeypatch.setattr(_grace, "clock", lambda: time.time() + ahead)


#: The operator's clock just after `make_unknown`'s lease ran out (the store moved LEASE + 1).
JUST_AFTER = LEASE + 2
#: The operator's clock once the grace period after that lease has passed.
AFTER_GRACE = LEASE + _grace.DEFAULT_GRACE + 60


# -- list --------------------------------------------------------------------------------------


async def test_list_all_by_state_and_as_json(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    operator_clock(monkeypatch, JUST_AFTER)
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        done = await client.call_tool("charge", ARGS, meta=meta("k-done"))
        await make_unknown(client, backend, effects, "k-lost")
    assert effects.count == 2 and marker(done)["status"] == "executed"

    table = await cli(capsys, "keys", "list", "--store", backend.url)
    assert table.code == 0, table.err
    lines = table.out.splitlines()
    assert lines[0].split() == list(COLUMNS)
    rows = {line.split()[0]: dict(zip(COLUMNS, line.split(), strict=True)) for line in lines[1:-1]}
    assert set(rows) == {record_key("k-done"), record_key("k-lost")}
    done, lost = rows[record_key("k-done")], rows[record_key("k-lost")]
    assert (done["tool"], done["state"], done["fence"]) == ("charge", "completed", "1")
    assert done["leaseRanOutAt"] == "-"  # its lease ended with a stored result
    assert (lost["tool"], lost["state"], lost["fence"]) == ("charge", "unknown", "1")
    assert lost["leaseRanOutAt"].endswith("Z")  # when the lost worker's lease ran out
    assert lost["leaseDeadline"] == lost["leaseRanOutAt"]
    assert (lost["expiresAt"], lost["resultBytes"]) == ("-", "-")  # kept until settled
    assert re.fullmatch(r"3\ds", lost["age"])  # the store moved LEASE + 1, the operator + 2
    assert len({line.index(" charge ") for line in lines[1:-1]}) == 1  # aligned columns
    assert lines[-1] == "(2 records, oldest first)"  # fewer than --limit: every record

    unknown = await cli(
        capsys, "keys", "list", "--state", "unknown", "--json", "--store", backend.url
    )
    assert unknown.code == 0
    [row] = unknown.json()
    assert row["key"] == record_key("k-lost") and row["tool"] == "charge"
    assert JUST_AFTER <= row["ageSeconds"] < JUST_AFTER + 30  # plus the real time gone by
    assert (row["state"], row["fence"], row["attempts"]) == ("unknown", 1, 1)
    assert row["leaseRanOutAt"] == row["leaseDeadline"] is not None and row["corrupt"] is None
    assert row["expiresAt"] is None and row["resultBytes"] is None and "result" not in row

    completed = await cli(
        capsys, "keys", "list", "--state", "completed", "--json", "--store", backend.url
    )
    [row] = completed.json()
    assert row["key"] == record_key("k-done") and row["resultBytes"] > 0
    assert "result" not in row  # a listing never shows stored results
    assert "charged" not in completed.out

    running = await cli(capsys, "keys", "list", "--state", "in_progress", "--store", backend.url)
    assert running.out.splitlines()[-1] == "(0 records, oldest first)"
    limited = await cli(capsys, "keys", "list", "--limit", "1", "--json", "--store", backend.url)
    assert len(limited.json()) == 1
    cut = await cli(capsys, "keys", "list", "--limit", "1", "--store", backend.url)
    assert cut.out.splitlines()[-1] == (
        "(1 record, the first 1 the store's scan met, not the 1 oldest; oldest first)"
        if backend.name == "redis"
        else "(1 record, oldest first)"
    )


#: The table's header: its columns, in order.
HEADER = (
    "key tool state age fence attempts leaseDeadline leaseRanOutAt expiresAt resultBytes server"
    " principal"
)
COLUMNS = HEADER.split()
HOURS = 3600.0


def listed_keys(ran: Any) -> list[str]:
    assert ran.code == 0, ran.err
    return [line.split()[0] for line in ran.out.splitlines()[1:-1]]


async def test_list_filters_by_tool_and_age_before_the_limit(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two records of each tool three hours old, then one of each just made. The store filters
    by tool before counting --limit, so `--tool refund --limit 1` finds the oldest refund, not
    the oldest record (a charge) filtered away."""
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        for key in ("c-old", "r-old", "c-new", "r-new"):
            await client.call_tool("charge" if key[0] == "c" else "refund", ARGS, meta=meta(key))
            backend.advance(3 * HOURS if key == "r-old" else 1)  # a strict order, then a gap
    operator_clock(monkeypatch, 3 * HOURS + 60)
    c_old, c_new = record_key("c-old"), record_key("c-new")
    r_old, r_new = record_key("r-old", "refund"), record_key("r-new", "refund")

    def listing(*argv: str) -> Any:
        return cli(capsys, "keys", "list", *argv, "--store", backend.url)

    assert listed_keys(await listing("--tool", "charge")) == [c_old, c_new]
    # Redis stops at the first match its scan meets (any refund); the others list oldest first.
    [refund] = listed_keys(await listing("--tool", "refund", "--limit", "1"))
    assert refund in ([r_old, r_new] if backend.name == "redis" else [r_old])
    assert listed_keys(await listing("--older-than", "2h")) == [c_old, r_old]
    assert listed_keys(await listing("--older-than", "7200")) == [c_old, r_old]
    assert listed_keys(await listing("--older-than", "2h", "--tool", "refund")) == [r_old]
    assert listed_keys(await listing("--older-than", "1d")) == []
    assert listed_keys(await listing("--older-than", "0")) == [c_old, r_old, c_new, r_new]
    assert listed_keys(await listing("--tool", "charge", "--state", "unknown")) == []
    assert listed_keys(await listing("--tool", "no-such-tool")) == []

    old = await listing("--older-than", "10m", "--tool", "charge", "--json")
    [row] = old.json()
    assert (row["key"], row["tool"], row["state"]) == (c_old, "charge", "completed")
    assert 3 * HOURS + 60 <= row["ageSeconds"] < 3 * HOURS + 90  # plus the real time gone by
    table = await listing("--tool", "refund")
    ages = [
        dict(zip(COLUMNS, line.split(), strict=True))["age"]
        for line in table.out.splitlines()[1:-1]
    ]
    assert ages[0].startswith("3h0") and re.fullmatch(r"\d+s|\dm\d\ds", ages[1])


async def test_a_record_without_a_tool_name_is_listed_with_a_dash(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the previous release wrote them (it stored no tool name), or a direct store user."""
    nameless = record_key("k-nameless")
    claim = await backend.store.claim(nameless, "f" * 64, lease=LEASE, takeover=False)
    assert claim.status.value == "claimed"
    table = await cli(capsys, "keys", "list", "--store", backend.url)
    [line] = table.out.splitlines()[1:-1]
    row = dict(zip(COLUMNS, line.split(), strict=True))
    assert (row["key"], row["tool"], row["state"]) == (nameless, "-", "in_progress")
    assert row["leaseDeadline"].endswith("Z") and row["leaseRanOutAt"] == "-"
    [as_json] = (await cli(capsys, "keys", "list", "--json", "--store", backend.url)).json()
    assert as_json["tool"] is None
    assert (
        listed_keys(await cli(capsys, "keys", "list", "--tool", "charge", "--store", backend.url))
        == []
    )
    shown = await cli(capsys, "keys", "show", nameless, "--store", backend.url)
    assert "tool: -" in shown.out.splitlines()


@pytest.mark.parametrize(
    "value", ["abc", "10M", "-5", "1h30m", "", "2 h", "inf", "nan", "1e3", "9" * 400]
)
def test_a_bad_older_than_is_a_clear_usage_error(
    value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "never-opened.sqlite3"
    ran = sync_cli(capsys, "keys", "list", "--older-than", value, "--store", f"sqlite:///{path}")
    assert ran.code == 2 and ran.out == "" and "Traceback" not in ran.err
    assert "argument --older-than:" in ran.err
    assert "duration" in ran.err and repr(value) in ran.err
    assert not path.exists()  # refused before the store was opened


def test_an_empty_tool_filter_is_a_clear_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "never-opened.sqlite3"
    for value in ("", "  "):
        ran = sync_cli(capsys, "keys", "list", "--tool", value, "--store", f"sqlite:///{path}")
        assert (ran.code, ran.out) == (2, "") and "--tool needs a tool name" in ran.err
    assert not path.exists()


# -- show --------------------------------------------------------------------------------------


def steady(shown: str) -> list[str]:
    """`keys show` output without the line that changes as time goes by (the age)."""
    return [line for line in shown.splitlines() if not line.startswith("ageSeconds: ")]


async def test_show_hides_the_result_unless_revealed_and_derives_the_store_key(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    effects = Effects()
    # One in-memory connection: a caller the server binds the keyless call's derived key to.
    async with Client(shop(backend.store, effects), mode="legacy") as client:
        first = await client.call_tool("charge", ARGS, meta=meta("k-show"))
        keyless = await client.call_tool("charge", {"order": "o-2", "cents": 1})
    charged = text(first)

    shown = await cli(capsys, "keys", "show", *derive_args("k-show"), "--store", backend.url)
    assert shown.code == 0, shown.err
    fields = dict(line.split(": ", 1) for line in shown.out.splitlines())
    # The key derived from what the client saw is the one the server stored the record under.
    assert fields["key"] == record_key("k-show")
    assert (fields["state"], fields["fence"], fields["attempts"]) == ("completed", "1", "1")
    assert "result" not in fields and charged not in shown.out
    assert int(fields["resultBytes"]) > 0

    by_store_key = await cli(capsys, "keys", "show", record_key("k-show"), "--store", backend.url)
    assert steady(by_store_key.out) == steady(shown.out)
    upper = await cli(capsys, "keys", "show", record_key("k-show").upper(), "--store", backend.url)
    assert steady(upper.out) == steady(shown.out)

    revealed = await cli(
        capsys,
        "keys",
        "show",
        *derive_args("k-show"),
        "--reveal-result",
        "--json",
        "--store",
        backend.url,
    )
    assert revealed.code == 0
    assert revealed.json()["result"] == {
        "content": [{"type": "text", "text": charged}],
        "structuredContent": {"result": charged},
        "isError": False,
    }
    plain_revealed = await cli(
        capsys, "keys", "show", record_key("k-show"), "--reveal-result", "--store", backend.url
    )
    assert charged in plain_revealed.out

    # A keyless call's record is found through the derived key its result announced.
    derived = marker(keyless)
    assert derived["keySource"] == "derived"
    found = await cli(
        capsys, "keys", "show", *derive_args(derived["key"]), "--json", "--store", backend.url
    )
    assert found.code == 0 and found.json()["state"] == "completed"

    missing = await cli(capsys, "keys", "show", *derive_args("k-never"), "--store", backend.url)
    assert missing.code == 1 and "no live record" in missing.err and missing.out == ""


# -- settle ------------------------------------------------------------------------------------


async def test_settle_with_result_text_is_replayed_to_the_next_call(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        await make_unknown(client, backend, effects, "k-text")
        assert effects.count == 1
        shown = await cli(capsys, "keys", "show", *derive_args("k-text"), "--store", backend.url)
        assert "state: unknown" in shown.out

        settled = await cli(
            capsys,
            "keys",
            "settle",
            *derive_args("k-text"),
            "--result-text",
            "reconciled: charged once",
            "--store",
            backend.url,
        )
        assert settled.code == 0, settled.err
        assert settled.out.strip() == f"settled {record_key('k-text')}: completed"

        replay = await client.call_tool("charge", ARGS, meta=meta("k-text"))
    assert text(replay) == "reconciled: charged once" and not replay.is_error
    # Also structured, as the tool's output schema (`-> str`) demands of any result it returns.
    assert replay.structured_content == {"result": "reconciled: charged once"}
    assert marker(replay)["status"] == "replayed" and marker(replay)["key"] == "k-text"
    assert effects.count == 1  # the operator's verdict stands in for a second charge
    left = await cli(capsys, "keys", "list", "--state", "unknown", "--json", "--store", backend.url)
    assert left.json() == []


async def test_settle_with_result_json_replays_that_result(
    backend: Backend, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    verdict = {
        "content": [{"type": "text", "text": "charge ch_42 confirmed by the bank"}],
        "structuredContent": {"result": "charge ch_42 confirmed by the bank"},
        "isError": False,
    }
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(verdict))
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        await make_unknown(client, backend, effects, "k-json")
        settled = await cli(
            capsys,
            "keys",
            "settle",
            record_key("k-json"),
            "--result-json",
            str(path),
            "--store",
            backend.url,
        )
        assert settled.code == 0, settled.err
        replay = await client.call_tool("charge", ARGS, meta=meta("k-json"))
    dumped = replay.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert {k: dumped[k] for k in verdict} == verdict
    assert marker(replay)["status"] == "replayed"
    assert effects.count == 1


async def test_settle_failed_lets_the_next_call_run_again(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    operator_clock(monkeypatch, AFTER_GRACE)
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        await make_unknown(client, backend, effects, "k-failed")
        settled = await cli(
            capsys, "keys", "settle", *derive_args("k-failed"), "--failed", "--store", backend.url
        )
        assert settled.code == 0, settled.err
        assert "released (the next call runs again)" in settled.out
        gone = await cli(capsys, "keys", "show", *derive_args("k-failed"), "--store", backend.url)
        assert gone.code == 1
        rerun = await client.call_tool("charge", ARGS, meta=meta("k-failed"))
        replay = await client.call_tool("charge", ARGS, meta=meta("k-failed"))
    assert marker(rerun)["status"] == "executed" and marker(rerun)["attempts"] == 2
    assert text(rerun) == "charged 500 for o-1 (execution 2)"
    assert marker(replay)["status"] == "replayed" and text(replay) == text(rerun)
    assert effects.count == 2


async def test_a_retention_below_the_grace_is_refused_and_a_settled_keys_fence_never_repeats(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 48: a record settled with a short `--retention` vanished, and the next retry charged
    at fence 1 again. Now a retention below the grace is a usage error (exit 2, nothing
    changed); one of at least the grace settles; once that record expired, the next call runs
    as a new intent (attempts 1) at a higher fence (rule 25)."""
    operator_clock(monkeypatch, AFTER_GRACE)
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        await make_unknown(client, backend, effects, "k-brief")
        before = await backend.store.get(record_key("k-brief"))
        settle = ["keys", "settle", *derive_args("k-brief"), "--result-text", "charged"]
        short = await cli(capsys, *settle, "--retention", "60", "--store", backend.url)
        assert short.code == 2 and short.out == ""
        assert "--retention 60 s is shorter than the grace of 90 s" in short.err
        assert "Nothing was changed" in short.err
        assert await backend.store.get(record_key("k-brief")) == before
        settled = await cli(capsys, *settle, "--retention", "90", "--store", backend.url)
        assert settled.code == 0, settled.err
        replay = await client.call_tool("charge", ARGS, meta=meta("k-brief"))
        assert marker(replay)["status"] == "replayed" and text(replay) == "charged"
        backend.advance(_grace.DEFAULT_GRACE + 1)  # the settled record expired
        rerun = await client.call_tool("charge", ARGS, meta=meta("k-brief"))
    assert marker(rerun)["status"] == "executed" and marker(rerun)["attempts"] == 1
    record = await backend.store.get(record_key("k-brief"))
    assert record is not None and (record.fence, record.attempts) == (2, 1)
    assert effects.count == 2  # the lost worker's charge, and the new call's


async def test_settle_refuses_a_record_that_is_not_unknown(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        first = await client.call_tool("charge", ARGS, meta=meta("k-ok"))
        before = await backend.store.get(record_key("k-ok"))
        for verdict in (["--result-text", "overwritten"], ["--failed"]):
            refused = await cli(
                capsys, "keys", "settle", *derive_args("k-ok"), *verdict, "--store", backend.url
            )
            assert refused.code == 1 and refused.out == ""
            assert "only an UNKNOWN record can be, and it is completed" in refused.err
        assert await backend.store.get(record_key("k-ok")) == before
        replay = await client.call_tool("charge", ARGS, meta=meta("k-ok"))
    assert text(replay) == text(first) and effects.count == 1

    absent = await cli(
        capsys, "keys", "settle", *derive_args("k-none"), "--failed", "--store", backend.url
    )
    assert absent.code == 1 and f"no live record for key {record_key('k-none')}" in absent.err
    assert await backend.store.get(record_key("k-none")) is None


async def test_a_bad_result_json_file_is_refused_and_changes_nothing(
    backend: Backend, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    invalid = tmp_path / "invalid.json"
    invalid.write_text("{not json")
    wrong_shape = tmp_path / "wrong.json"
    wrong_shape.write_text(json.dumps({"content": "charged"}))
    not_utf8 = tmp_path / "binary.json"
    not_utf8.write_bytes(b"\xff\xfe\x00garbage")
    cases = {
        tmp_path / "missing.json": "cannot read",
        invalid: "is not a CallToolResult",
        wrong_shape: "is not a CallToolResult",
        not_utf8: "is not a CallToolResult",
        tmp_path: "cannot read",  # a directory
    }
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        await make_unknown(client, backend, effects, "k-bad")
        before = await backend.store.get(record_key("k-bad"))
        assert before is not None and before.state is RecordState.UNKNOWN
        for path, why in cases.items():
            refused = await cli(
                capsys,
                "keys",
                "settle",
                *derive_args("k-bad"),
                "--result-json",
                str(path),
                "--store",
                backend.url,
            )
            assert refused.code == 2, (path, refused)
            assert why in refused.err and str(path) in refused.err
            assert "Traceback" not in refused.err
        assert await backend.store.get(record_key("k-bad")) == before
        with pytest.raises(MCPError) as still:
            await client.call_tool("charge", ARGS, meta=meta("k-bad"))
    assert still.value.code == wire.OUTCOME_UNKNOWN and effects.count == 1


async def test_settle_failed_is_refused_within_the_grace_period_unless_forced(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lost worker's lease ran out a moment ago: it may be paused, not dead, and would charge
    when it resumes. `--failed` refuses (exit 1, the record untouched) and says until when;
    `--force`, or a grace period the lease has outlived, settles."""
    operator_clock(monkeypatch, JUST_AFTER)
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        for key in ("k-soon", "k-forced", "k-short-grace"):
            await make_unknown(client, backend, effects, key)
        before = await backend.store.get(record_key("k-soon"))
        assert before is not None and before.lease_deadline is not None

        refused = await cli(
            capsys, "keys", "settle", *derive_args("k-soon"), "--failed", "--store", backend.url
        )
        assert refused.code == 1 and refused.out == ""
        assert "refusing to settle" in refused.err and "fence 1" in refused.err
        assert "may be paused rather than dead" in refused.err and "--force" in refused.err
        assert f"({_rfc3339(before.lease_deadline)})" in refused.err
        assert _rfc3339(before.lease_deadline + _grace.DEFAULT_GRACE) in refused.err
        assert await backend.store.get(record_key("k-soon")) == before
        with pytest.raises(MCPError) as still:
            await client.call_tool("charge", ARGS, meta=meta("k-soon"))
        assert still.value.code == wire.OUTCOME_UNKNOWN

        # A verdict with a result is not refused: it runs nothing again.
        text_verdict = await cli(
            capsys,
            "keys",
            "settle",
            *derive_args("k-soon"),
            "--result-text",
            "charged once",
            "--store",
            backend.url,
        )
        assert text_verdict.code == 0, text_verdict.err

        forced = await cli(
            capsys,
            "keys",
            "settle",
            *derive_args("k-forced"),
            "--failed",
            "--force",
            "--store",
            backend.url,
        )
        assert forced.code == 0 and "released" in forced.out
        # Each `make_unknown` moved the store's clock on: the operator looks 2 s after this
        # record's lease ran out, with a grace of 1 s.
        latest = await backend.store.get(record_key("k-short-grace"))
        assert latest is not None and latest.lease_deadline is not None
        monkeypatch.setattr(_grace, "clock", lambda: latest.lease_deadline + 2)
        short = await cli(
            capsys,
            "keys",
            "settle",
            *derive_args("k-short-grace"),
            "--failed",
            "--grace",
            "1",
            "--store",
            backend.url,
        )
        assert short.code == 0 and "released" in short.out
        rerun = await client.call_tool("charge", ARGS, meta=meta("k-forced"))
    assert marker(rerun)["status"] == "executed" and marker(rerun)["attempts"] == 2


async def test_show_says_when_the_last_lease_ran_out_and_its_fence(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    operator_clock(monkeypatch, JUST_AFTER)
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        await make_unknown(client, backend, effects, "k-when")
    record = await backend.store.get(record_key("k-when"))
    assert record is not None and record.lease_deadline is not None
    shown = await cli(capsys, "keys", "show", *derive_args("k-when"), "--store", backend.url)
    fields = dict(line.split(": ", 1) for line in shown.out.splitlines())
    assert fields["state"] == "unknown" and fields["fence"] == "1"
    assert fields["leaseRanOutAt"] == _rfc3339(record.lease_deadline)
    monkeypatch.setattr(_grace, "clock", lambda: record.lease_deadline - 1)  # still running
    early = await cli(
        capsys, "keys", "show", record_key("k-when"), "--json", "--store", backend.url
    )
    assert early.json()["leaseRanOutAt"] is None
    assert early.json()["leaseDeadline"] == _rfc3339(record.lease_deadline)


async def test_list_shows_corrupt_records_and_exits_1(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record the store cannot read, and one whose stored result is unreadable: both answer
    -32014 to a client, and both are listed as corrupt, never skipped."""
    effects = Effects()
    bad = record_key("k-garbled", tool="other")  # a readable record holding a foreign result
    claim = await backend.store.claim(bad, "f" * 64, lease=LEASE, takeover=False)
    assert claim.token is not None
    assert await backend.store.complete(bad, claim.token, b"\xff garbage", retention=60)
    async with Client(shop(backend.store, effects)) as client:
        for key in ("k-fine", "k-damaged"):
            await client.call_tool("charge", ARGS, meta=meta(key))
        backend.damage(record_key("k-damaged"))
        with pytest.raises(MCPError) as refused:
            await client.call_tool("charge", ARGS, meta=meta("k-damaged"))
    assert refused.value.code == wire.CORRUPT_RECORD
    assert refused.value.error.data == {"key": "k-damaged"}
    assert effects.count == 2

    listed = await cli(capsys, "keys", "list", "--json", "--store", backend.url)
    assert listed.code == 1
    states = {row["key"]: (row["state"], row["corrupt"]) for row in listed.json()}
    assert states[record_key("k-fine")] == ("completed", None)
    assert states[bad][0] == "corrupt" and "stored result is unreadable" in states[bad][1]
    assert states[record_key("k-damaged")][0] == "corrupt" and states[record_key("k-damaged")][1]
    assert f"record {record_key('k-damaged')} is corrupt" in listed.err
    assert f"record {bad} is corrupt" in listed.err

    table = await cli(capsys, "keys", "list", "--state", "corrupt", "--store", backend.url)
    assert table.code == 1
    rows = {line.split()[0]: line.split()[1:3] for line in table.out.splitlines()[1:-1]}
    # The damaged record's tool cannot be read; the one with a foreign result named none.
    assert rows == {record_key("k-damaged"): ["-", "corrupt"], bad: ["-", "corrupt"]}
    healthy = await cli(capsys, "keys", "list", "--state", "unknown", "--store", backend.url)
    assert healthy.out.splitlines()[-1] == "(0 records, oldest first)"
    # A filtered view cannot place an unreadable record it meets, and says so instead of hiding
    # it (SQLite filters rows before reading them: it meets only rows of that tool, Redis all).
    by_tool = await cli(capsys, "keys", "list", "--tool", "charge", "--store", backend.url)
    assert by_tool.code == 0 and listed_keys(by_tool) == [record_key("k-fine")]
    assert "1 unreadable record(s) not shown" in by_tool.err and "--state corrupt" in by_tool.err

    shown = await cli(capsys, "keys", "show", record_key("k-damaged"), "--store", backend.url)
    assert shown.code == 1 and "corrupted or foreign" in shown.err
    garbled = await cli(capsys, "keys", "show", bad, "--json", "--store", backend.url)
    assert garbled.code == 1 and garbled.json()["state"] == "corrupt"


def _rfc3339(timestamp: float) -> str:
    from idempotency import rfc3339

    return rfc3339(timestamp)


# -- purge -------------------------------------------------------------------------------------


async def test_purge_removes_only_expired_records(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        await client.call_tool("charge", ARGS, meta=meta("k-old"))
        await make_unknown(client, backend, effects, "k-lost")
    assert backend.raw_count() == 2

    now = await cli(capsys, "keys", "purge", "--store", backend.url)
    assert (now.code, now.out.strip()) == (0, "purged 0 expired records")
    assert backend.raw_count() == 2

    # A day and more later (the store's clock moved, nothing slept): the completed record is
    # past its retention; the UNKNOWN one waits for an operator, however long it takes.
    later = 24 * 3600 + LEASE + 60
    monkeypatch.setattr(_common, "open_store", lambda url: backend.open_later(url, later))
    purged = await cli(capsys, "keys", "purge", "--store", backend.url)
    assert (purged.code, purged.out.strip()) == (0, "purged 1 expired record")
    assert backend.raw_count() == 1
    [left] = (await cli(capsys, "keys", "list", "--json", "--store", backend.url)).json()
    assert (left["key"], left["state"]) == (record_key("k-lost"), "unknown")


# -- failures before and around the store --------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("foo://somewhere", "unknown key store scheme 'foo'"),
        ("memory://elsewhere", "the memory store takes no location"),
        ("sqlite:///", "names no file"),
        ("sqlite:///keys.db?mode=ro", "unknown key store URL option 'mode'"),
        ("", "must be a non-empty string"),
    ],
)
def test_a_bad_store_url_exits_2_with_a_clear_message(
    url: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["keys", "list"], ["keys", "purge"], ["keys", "show", "0" * 64]):
        ran = sync_cli(capsys, *argv, "--store", url)
        assert ran.code == 2 and ran.out == ""
        assert ran.err.startswith("mcp-once: bad key store URL:") and why in ran.err


def test_an_unreachable_redis_exits_3_with_a_clear_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()  # nothing listens there
    for argv in (["list"], ["purge"], ["show", "0" * 64], ["settle", "0" * 64, "--failed"]):
        ran = sync_cli(capsys, "keys", *argv, "--store", f"redis://:s3cret@127.0.0.1:{port}/0")
        assert ran.code == 3 and ran.out == ""
        assert ran.err.startswith(
            f"mcp-once: the key store at 'redis://:***@127.0.0.1:{port}/0' cannot be reached:"
        )
        assert "s3cret" not in ran.err and "Traceback" not in ran.err


def test_an_sqlite_file_in_a_missing_directory_exits_3(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/no-such-dir/keys.sqlite3"
    ran = sync_cli(capsys, "keys", "list", "--store", url)
    assert ran.code == 3 and "cannot be reached" in ran.err and "does not exist" in ran.err
    assert not (tmp_path / "no-such-dir").exists()


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["keys", "show"], "give a store key, or --client-key and --tool"),
        (["keys", "show", "--client-key", "k"], "give a store key, or --client-key and --tool"),
        (["keys", "show", "0" * 64, "--client-key", "k"], "not both"),
        (["keys", "show", "k-1"], "'k-1' is not a store key"),
        (["keys", "show", *derive_args("x" * 256)], "--client-key: the idempotency key is 256"),
        (["keys", "show", *derive_args("bell\a")], "--client-key: the idempotency key must be"),
        (["keys", "settle", "0" * 64, "--failed", "--retention", "0"], "--retention must be"),
        (["keys", "settle", "0" * 64, "--failed", "--retention", "nan"], "--retention must be"),
        (
            ["keys", "settle", "0" * 64, "--result-text", "x", "--retention", "89"],
            "--retention 89 s is shorter than the grace of 90 s",
        ),
        (
            ["keys", "settle", "0" * 64, "--failed", "--retention", "5", "--grace", "6"],
            "--retention 5 s is shorter than the grace of 6 s",
        ),
        (["keys", "list", "--limit", "0"], "--limit must be at least 1"),
    ],
)
def test_usage_errors_exit_2_before_the_store_is_opened(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/untouched.sqlite3"
    ran = sync_cli(capsys, *argv, "--store", url)
    assert ran.code == 2 and why in ran.err and ran.out == ""
    assert not (tmp_path / "untouched.sqlite3").exists()


def test_settle_needs_exactly_one_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    for verdict in ([], ["--failed", "--result-text", "x"]):
        ran = sync_cli(capsys, "keys", "settle", "0" * 64, *verdict, "--store", "memory://")
        assert ran.code == 2 and "usage:" in ran.err


# -- the installed console script ----------------------------------------------------------------


def _console_script() -> str:
    script = Path(sys.executable).with_name("mcp-once")
    assert script.exists(), f"the console script is not installed next to {sys.executable}"
    return str(script)


async def test_the_console_script_lists_shows_and_fails_like_main(
    backend: Backend, tmp_path: Path
) -> None:
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        await make_unknown(client, backend, effects, "k-sub")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [_console_script(), *argv], capture_output=True, text=True, timeout=60, check=False
        )

    listed = await anyio.to_thread.run_sync(
        functools.partial(run, "keys", "list", "--json", "--store", backend.url)
    )
    assert listed.returncode == 0, listed.stderr
    assert [(r["key"], r["state"]) for r in json.loads(listed.stdout)] == [
        (record_key("k-sub"), "unknown")
    ]
    settle = ["keys", "settle", *derive_args("k-sub"), "--failed", "--store", backend.url]
    too_soon = await anyio.to_thread.run_sync(functools.partial(run, *settle))
    assert too_soon.returncode == 1 and "refusing to settle" in too_soon.stderr
    settled = await anyio.to_thread.run_sync(functools.partial(run, *settle, "--force"))
    assert settled.returncode == 0 and "released" in settled.stdout
    dead = await anyio.to_thread.run_sync(
        functools.partial(run, "keys", "list", "--store", f"redis://127.0.0.1:{free_port()}/0")
    )
    assert dead.returncode == 3 and "cannot be reached" in dead.stderr
    assert "Traceback" not in dead.stderr


# -- a death its holder saw, and a settle corrected (issue 43, items 7 and 8) ---------------------

#: What the proxy says of an upstream child that died mid-call (`OutcomeLost`'s why).
DIED = "the upstream process exited while the call ran; its effect may have happened"


def relay(store: KeyStore, effects: Effects, *, ended: bool) -> MCPServer:
    """A `charge` whose own downstream call dies after its effect: it gives the execution up as
    `OutcomeLost`, saying whether it saw that execution end (the proxy: its stdio child exited)."""
    server = MCPServer(SERVER)

    @server.tool()
    @idempotent(store, lease=LEASE)
    async def charge(order: str, cents: int) -> str:
        effects.count += 1
        raise OutcomeLost(DIED, ended=ended)

    return server


@pytest.mark.parametrize("ended", [True, False], ids=["ended", "maybe-running"])
async def test_settle_failed_needs_no_grace_where_the_holder_saw_the_execution_end(
    backend: Backend, capsys: pytest.CaptureFixture[str], ended: bool
) -> None:
    """The holder turned the record UNKNOWN itself, at once, and said why: the caller and every
    re-send get those words (never that a lease stopped renewing). Where it saw the execution end
    (`ended`), `--failed` settles at once without `--force`: the grace is for a holder that may
    be paused, and this one was alive to say so. Where it did not, the grace stands."""
    effects = Effects()
    async with Client(relay(backend.store, effects, ended=ended)) as client:
        answers = []
        for _ in range(2):
            with pytest.raises(MCPError) as lost:
                await client.call_tool("charge", ARGS, meta=meta("k-died"))
            answers.append(lost.value)
        assert [a.code for a in answers] == [wire.OUTCOME_UNKNOWN] * 2
        assert all(DIED in a.message for a in answers), [a.message for a in answers]
        assert not any("renewing" in a.message or "(not_" in a.message for a in answers)
        assert effects.count == 1
        settled = await cli(
            capsys, "keys", "settle", *derive_args("k-died"), "--failed", "--store", backend.url
        )
        if not ended:
            assert settled.code == 1 and "may be paused rather than dead" in settled.err
            record = await backend.store.get(record_key("k-died"))
            assert record is not None and record.state is RecordState.UNKNOWN
            return
        assert settled.code == 0, settled.err
        assert "released (the next call runs again)" in settled.out
        with pytest.raises(MCPError):
            await client.call_tool("charge", ARGS, meta=meta("k-died"))
    assert effects.count == 2  # the operator's verdict: it runs again


async def test_settle_force_replaces_an_operators_settle_never_an_execution(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    """A settle that put the wrong answer in is corrected with `--force` (refused without it),
    both settles in the history; a record the tool itself completed is never replaced."""
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        await make_unknown(client, backend, effects, "k-again")

        async def settle(*verdict: str) -> Ran:
            args = ["keys", "settle", *derive_args("k-again"), *verdict, "--store", backend.url]
            return await cli(capsys, *args)

        assert (await settle("--result-text", "first verdict", "--by", "ana")).code == 0
        first = await client.call_tool("charge", ARGS, meta=meta("k-again"))
        assert text(first) == "first verdict"
        refused = await settle("--result-text", "second verdict")
        assert refused.code == 1 and "already settled as completed by ana" in refused.err
        assert "--force" in refused.err
        again = await settle("--result-text", "second verdict", "--force", "--reason", "typo")
        assert again.code == 0, again.err
        assert "replacing the earlier settle" in again.out
        second = await client.call_tool("charge", ARGS, meta=meta("k-again"))
        assert text(second) == "second verdict" and marker(second)["status"] == "replayed"
        history = await cli(
            capsys, "keys", "history", *derive_args("k-again"), "--json", "--store", backend.url
        )
        settles = [e for e in history.json() if e["event"] == "settled"]
        assert [(e["answer"], e.get("by"), e.get("replaces")) for e in settles] == [
            ("done", "ana", None),
            ("done", settles[1]["by"], "settled"),
        ]
        assert settles[1]["reason"] == "typo"
        # And settled failed after all: released, the next call runs.
        failed = await settle("--failed", "--force")
        assert failed.code == 0 and "released" in failed.out
        rerun = await client.call_tool("charge", ARGS, meta=meta("k-again"))
        assert marker(rerun)["status"] == "executed" and effects.count == 2

        executed = await client.call_tool("refund", ARGS, meta=meta("k-ran"))
        ran = ["--client-key", "k-ran", "--tool", "refund", "--server", SERVER]
        for verdict in (["--result-text", "x"], ["--failed"]):
            never = await cli(
                capsys, "keys", "settle", *ran, *verdict, "--force", "--store", backend.url
            )
            assert never.code == 1 and "an executed record is never replaced" in never.err
        replay = await client.call_tool("refund", ARGS, meta=meta("k-ran"))
    assert text(replay) == text(executed)


async def test_a_result_the_proxys_listed_output_schema_rejects_is_not_settled(
    backend: Backend,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the record is a proxy's (`--proxy NAME`, or `--server` naming a proxy) its manifest
    holds the tools' output schemas as last listed: a result that does not match is refused,
    before anything is written (every replay of it would fail in the caller's SDK). Elsewhere
    the schema is not on this machine, and the settle is not checked (docs/runbook.md)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    schema = {
        "type": "object",
        "properties": {"success": {"type": "boolean"}, "message": {"type": "string"}},
        "required": ["success", "message"],
    }
    manifest = Manifest(
        name="shop",
        id="0123456789ab",
        server=SERVER,
        store=backend.url,
        upstream="node shop.js",
        started_at=time.time(),
        output_schemas={"charge": schema},
    )
    record(manifest, "shop-0123456789ab")
    good = tmp_path / "good.json"
    good.write_text(
        json.dumps(
            {
                "content": [{"type": "text", "text": "charged"}],
                "structuredContent": {"success": True, "message": "charged"},
            }
        )
    )
    effects = Effects()
    async with Client(shop(backend.store, effects)) as client:
        await make_unknown(client, backend, effects, "k-shape")
        before = await backend.store.get(record_key("k-shape"))
        by_proxy = ["--client-key", "k-shape", "--tool", "charge", "--proxy", "shop"]
        for named in (by_proxy, [*derive_args("k-shape"), "--store", backend.url]):
            refused = await cli(capsys, "keys", "settle", *named, "--result-text", "charged")
            assert refused.code == 1, refused
            assert "refusing to settle" in refused.err and "--result-text" in refused.err
            assert "output schema" in refused.err and "'success' is a required" in refused.err
        assert await backend.store.get(record_key("k-shape")) == before
        fits = await cli(capsys, "keys", "settle", *by_proxy, "--result-json", str(good))
        assert fits.code == 0, fits.err
