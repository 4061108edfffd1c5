"""Rule 19 through the guard: `reconcile=` asks the system of record about an in-doubt record
on the retry itself, on every store (memory, SQLite, Redis), under asyncio and trio.

A lost worker is played by the test: it claims the record in the server's store and lets the
store's clock run past the lease, so the retry finds it in doubt (UNKNOWN, or IN_PROGRESS with
its lease run out). Effects are counted by the tool body (`Effects`); asks by the reconciler.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from fake_clock import FakeClock
from mcp import MCPError
from mcp.client import Client
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)
from server_kit import (
    SOON,
    Effects,
    body,
    call_fingerprint,
    effect_server,
    marker,
    meta,
    record_key,
)

from idempotency import (
    InDoubt,
    KeyStore,
    MemoryKeyStore,
    Reconciled,
    RecordState,
    RedisKeyStore,
    SQLiteKeyStore,
    idempotent,
    idempotent_call_tool,
    install,
    parse_history,
    wire,
)

pytestmark = pytest.mark.anyio

ARGS = {"order": "o-1", "cents": 500}
LEASE = 30.0


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@dataclass
class Doubtful:
    """A store whose clock the test moves, so a claim's lease runs out without sleeping."""

    store: KeyStore
    advance: Callable[[float], None]


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def doubtful(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Doubtful]:
    clock = FakeClock()
    made: KeyStore
    if request.param == "memory":
        made = MemoryKeyStore(clock=clock)
        advance = clock.advance
    elif request.param == "sqlite":
        made = SQLiteKeyStore(tmp_path / "keys.db", clock=clock)
        advance = clock.advance
    else:
        redis = RedisKeyStore.from_url(
            request.getfixturevalue("redis_url"), prefix=request.getfixturevalue("redis_namespace")
        )
        made, advance = redis, redis.advance_clock_for_testing
    try:
        yield Doubtful(made, advance)
    finally:
        await made.aclose()


async def lost_worker(d: Doubtful, key: str, *, unknown: bool = True, tool: str = "charge") -> str:
    """A worker that claimed `key` on server "shop" and vanished mid-tool; the record's name.
    `unknown`: a claim already found it and turned it UNKNOWN; else it is IN_PROGRESS, its
    lease run out (the retry's claim turns it UNKNOWN)."""
    name = record_key("shop", tool, key)
    fp = call_fingerprint(tool, ARGS)
    first = await d.store.claim(name, fp, lease=LEASE, takeover=False, tool=tool)
    assert first.status.value == "claimed"
    d.advance(LEASE + 1)
    if unknown:
        assert (await d.store.claim(name, fp, lease=LEASE, takeover=False)).status.value == (
            "unknown"
        )
    return name


async def story(d: Doubtful, name: str) -> list[str]:
    """The record's history (rule 20), event kinds in order."""
    return [e.kind for e in parse_history(await d.store.history(name))]  # type: ignore[attr-defined]


@dataclass
class Provider:
    """The system of record the reconciler asks: what it says, and every question it got."""

    says: Callable[[InDoubt], Reconciled | None]
    asked: list[InDoubt] = field(default_factory=list)
    gate: anyio.Event | None = None

    async def __call__(self, doubt: InDoubt) -> Reconciled | None:
        self.asked.append(doubt)
        if self.gate is not None:
            await self.gate.wait()
        return self.says(doubt)


def provider_charge(doubt: InDoubt) -> Reconciled:
    return Reconciled.happened(f"charged 500 for o-1 (provider charge {doubt.record[:8]})")


async def call(client: Client, key: str, tool: str = "charge") -> CallToolResult:
    with anyio.fail_after(SOON):
        return await client.call_tool(tool, ARGS, meta=meta(key))


async def refused(client: Client, key: str) -> MCPError:
    with pytest.raises(MCPError) as caught:
        await call(client, key)
    return caught.value


@pytest.mark.parametrize("unknown", [True, False], ids=["unknown", "lease-ran-out"])
async def test_happened_answers_with_the_providers_result_and_never_runs_the_tool(
    doubtful: Doubtful, unknown: bool
) -> None:
    effects = Effects()
    provider = Provider(provider_charge)
    server = effect_server(doubtful.store, effects, gated=False, reconcile=provider)
    name = await lost_worker(doubtful, "k-1", unknown=unknown)
    async with Client(server, mode="legacy") as client:
        first = await call(client, "k-1")
        again = await call(client, "k-1")
    assert effects.count == 0
    assert len(provider.asked) == 1
    asked = provider.asked[0]
    assert (asked.tool, asked.key, asked.record, asked.fence, asked.attempts) == (
        "charge",
        "k-1",
        name,
        1,
        1,
    )
    assert asked.arguments == ARGS
    assert asked.lease_ended_at is not None and asked.claimed_at < asked.lease_ended_at
    text = f"charged 500 for o-1 (provider charge {name[:8]})"
    assert body(first)["content"][0]["text"] == text
    mark = marker(first)
    assert (mark["status"], mark[wire.MARKER_RECONCILED]) == ("replayed", True)
    assert body(again) == body(first)
    assert marker(again)["status"] == "replayed" and wire.MARKER_RECONCILED not in marker(again)
    record = await doubtful.store.get(name)
    assert record is not None and record.state is RecordState.COMPLETED
    # Rule 20: the lost lease (and, found UNKNOWN, the retry refused), the reconciliation's
    # claim, its answer, then its completion.
    assert await story(doubtful, name) == [
        "claimed", "lease ran out", *(["refused"] if unknown else []),
        "claimed", "reconciled", "completed", "replayed",
    ]  # fmt: skip


async def test_not_happened_runs_the_tool_once_under_a_higher_fence(doubtful: Doubtful) -> None:
    effects = Effects()
    provider = Provider(lambda _: Reconciled.not_happened())
    server = effect_server(doubtful.store, effects, gated=False, reconcile=provider)
    name = await lost_worker(doubtful, "k-2")
    async with Client(server, mode="legacy") as client:
        first = await call(client, "k-2")
        again = await call(client, "k-2")
    assert effects.count == 1 and len(provider.asked) == 1
    assert marker(first)["status"] == "executed" and marker(again)["status"] == "replayed"
    assert body(again) == body(first)
    record = await doubtful.store.get(name)
    assert record is not None and (record.state, record.fence) == (RecordState.COMPLETED, 2)
    events = parse_history(await doubtful.store.history(name))  # type: ignore[attr-defined]
    assert [(e.kind, e.fence) for e in events] == [
        ("claimed", 1), ("lease ran out", 1), ("refused", 1), ("claimed", 2),
        ("reconciled", 2), ("completed", 2), ("replayed", 2),
    ]  # fmt: skip
    assert events[4].details == {"answer": "not_happened"}


class Boom(Exception):
    pass


def secret_raiser(doubt: InDoubt) -> Reconciled:
    raise Boom(f"card {doubt.arguments}")


async def never_answers(doubt: InDoubt) -> Reconciled:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    "reconciler",
    [
        lambda _: Reconciled.unknown(),
        lambda _: None,
        secret_raiser,
        never_answers,
        lambda _: "yes",
        lambda _: Reconciled.happened(object()),  # no conversion to a result exists
    ],
    ids=["unknown", "none", "raises", "times-out", "wrong-type", "unconvertible"],
)
async def test_anything_but_an_answer_leaves_it_unknown(
    doubtful: Doubtful, reconciler: Any, caplog: pytest.LogCaptureFixture
) -> None:
    effects = Effects()
    server = effect_server(
        doubtful.store, effects, gated=False, reconcile=reconciler, reconcile_timeout=0.2
    )
    name = await lost_worker(doubtful, "k-3")
    caplog.set_level(logging.DEBUG, logger="idempotency")
    async with Client(server, mode="legacy") as client:
        error = await refused(client, "k-3")
    assert error.error.code == wire.OUTCOME_UNKNOWN
    assert effects.count == 0
    record = await doubtful.store.get(name)
    assert record is not None and (record.state, record.fence) == (RecordState.UNKNOWN, 2)
    assert "o-1" not in caplog.text and "500" not in caplog.text  # never the arguments


async def test_without_reconcile_it_is_minus_32012_as_before(doubtful: Doubtful) -> None:
    effects = Effects()
    server = effect_server(doubtful.store, effects, gated=False)
    name = await lost_worker(doubtful, "k-4")
    async with Client(server, mode="legacy") as client:
        error = await refused(client, "k-4")
    assert error.error.code == wire.OUTCOME_UNKNOWN and effects.count == 0
    record = await doubtful.store.get(name)
    assert record is not None and (record.state, record.fence) == (RecordState.UNKNOWN, 1)


async def test_a_sync_reconciler_runs_in_a_worker_thread(doubtful: Doubtful) -> None:
    threads: list[threading.Thread] = []

    def lookup(doubt: InDoubt) -> Reconciled:
        threads.append(threading.current_thread())
        return Reconciled.happened("found")

    server = effect_server(doubtful.store, Effects(), gated=False, reconcile={"charge": lookup})
    await lost_worker(doubtful, "k-5")
    async with Client(server, mode="legacy") as client:
        first = await call(client, "k-5")
    assert body(first)["content"][0]["text"] == "found"
    assert threads and threads[0] is not threading.main_thread()


async def test_a_mapping_asks_only_the_named_tools_reconciler(doubtful: Doubtful) -> None:
    provider = Provider(provider_charge)
    server = effect_server(doubtful.store, Effects(), gated=False, reconcile={"refund": provider})
    await lost_worker(doubtful, "k-6")
    async with Client(server, mode="legacy") as client:
        error = await refused(client, "k-6")
    assert error.error.code == wire.OUTCOME_UNKNOWN and provider.asked == []


@pytest.mark.parametrize("says", ["happened", "not_happened"])
async def test_concurrent_retries_share_one_reconciliation(doubtful: Doubtful, says: str) -> None:
    """Two retries of one in-doubt record at once: the reconciler is asked once, and both get
    the same answer; a not_happened runs the tool once."""
    effects = Effects()
    gate = anyio.Event()
    provider = Provider(
        provider_charge if says == "happened" else (lambda _: Reconciled.not_happened()),
        gate=gate,
    )
    server = effect_server(doubtful.store, effects, gated=False, reconcile=provider)
    await lost_worker(doubtful, "k-7")
    results: list[CallToolResult] = []
    async with Client(server, mode="legacy") as one, Client(server, mode="legacy") as two:

        async def retry(client: Client) -> None:
            results.append(await call(client, "k-7"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(retry, one)
            with anyio.fail_after(SOON):
                while not provider.asked:  # the first retry holds the record, asking
                    await anyio.lowlevel.checkpoint()
            tg.start_soon(retry, two)
            await anyio.wait_all_tasks_blocked()
            gate.set()
    assert len(provider.asked) == 1
    assert effects.count == (0 if says == "happened" else 1)
    assert len(results) == 2 and body(results[0]) == body(results[1])


async def test_a_store_that_cannot_take_a_verdict_is_refused_up_front() -> None:
    class Old(MemoryKeyStore):  # a KeyStore of one's own written before rule 19
        reconcile = None
        leave_unknown = None

    with pytest.raises(TypeError, match="reconcile"):
        idempotent(Old(), reconcile=provider_charge)
    idempotent(Old())  # without reconcile= it keeps working


async def test_install_converts_a_happened_value_as_the_tool_returns(doubtful: Doubtful) -> None:
    """Structured output: the value becomes content and structuredContent, as a return does."""
    server = MCPServer("shop")

    @server.tool()
    async def charge(order: str, cents: int) -> dict[str, Any]:
        raise AssertionError("never runs: the provider says it happened")

    install(server, doubtful.store, reconcile={"charge": lambda _: Reconciled.happened({"id": 7})})
    await lost_worker(doubtful, "k-8")
    async with Client(server, mode="legacy") as client:
        first = await call(client, "k-8")
    assert first.structured_content == {"id": 7}
    assert marker(first)[wire.MARKER_RECONCILED] is True


async def test_the_low_level_handler_takes_a_call_tool_result(doubtful: Doubtful) -> None:
    async def handler(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        raise AssertionError("never runs: the provider says it happened")

    async def listing(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        return ListToolsResult(tools=[Tool(name="charge", input_schema={"type": "object"})])

    found = CallToolResult(content=[TextContent(type="text", text="ch_1")])
    guarded = idempotent_call_tool(
        doubtful.store, handler, server_name="shop", reconcile=lambda _: Reconciled.happened(found)
    )
    server = Server("shop", on_call_tool=guarded, on_list_tools=listing)
    await lost_worker(doubtful, "k-9")
    async with Client(server, mode="legacy") as client:
        first = await call(client, "k-9")
    assert body(first)["content"][0]["text"] == "ch_1"


@pytest.mark.parametrize(
    ("says", "counted"),
    [
        (lambda _: Reconciled.happened("found"), ["happened"]),
        (lambda _: Reconciled.not_happened(), ["not_happened"]),
        (lambda _: None, ["unknown"]),
        (secret_raiser, ["unknown"]),
    ],
    ids=["happened", "not_happened", "unknown", "raises"],
)
async def test_every_answer_is_counted(
    doubtful: Doubtful, says: Any, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mcp_once.server.reconciliations` by answer (docs/observability.md)."""
    from idempotency._guard import reconcile as module

    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(module, "count_reconciliation", lambda tool, a: seen.append((tool, a)))
    server = effect_server(doubtful.store, Effects(), gated=False, reconcile=says)
    await lost_worker(doubtful, "k-10")
    async with Client(server, mode="legacy") as client:
        with contextlib.suppress(MCPError):
            await call(client, "k-10")
    assert seen == [("charge", answer) for answer in counted]
