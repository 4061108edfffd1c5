"""Issue #24, the client half: `RetryingSession` against a tool whose listing names a key
argument (`keyArgument` in its `_meta` entry) puts the call's key there on every attempt, as well
as in `_meta`, and takes a key the caller already put there as the call's key.

The server is a real `MCPServer` with a guarded tool (`@idempotent(key_argument=...)`); what it
received is read on its side, in `call_tool` (every attempt, before the guard) and in the ledger
of effects the body writes (what ran). The lossy link is `orchestrator.chaos`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from mcp.client import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult

from idempotency import MemoryKeyStore, idempotent, wire
from orchestrator import MemoryJournal, RetryingSession, RetryPolicy, Run
from orchestrator.chaos import Chaos, Fault, FaultPlan

pytestmark = pytest.mark.anyio

PATHS = ["idempotency_key", "meta.idempotency-key"]
POLICY = RetryPolicy(max_attempts=3, attempt_timeout=1.0, deadline=30.0)


def at(arguments: dict[str, Any], path: str) -> object:
    node: Any = arguments
    for part in path.split("."):
        node = node[part]
    return node


def with_key(path: str, key: object, arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` (which hold nothing on `path`'s way) with `key` at the dotted `path`."""
    *parents, leaf = path.split(".")
    value: dict[str, Any] = {leaf: key}
    for part in reversed(parents):
        value = {part: value}
    return {**arguments, **value}


@dataclass
class Arrival:
    arguments: dict[str, Any]
    meta_key: object


@dataclass
class Shop:
    """What the server saw: every `tools/call` as it arrived, and every effect that ran."""

    arrivals: list[Arrival] = field(default_factory=list)
    ledger: list[str] = field(default_factory=list)


class RecordingServer(MCPServer):
    """An `MCPServer` that writes down each call's arguments and `_meta` key as they arrive,
    before the idempotency layer (which sits in the tool) sees them."""

    def __init__(self, name: str, shop: Shop) -> None:
        super().__init__(name)
        self.shop = shop

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> Any:
        meta = dict(context.request_context.meta or {}) if context is not None else {}
        self.shop.arrivals.append(Arrival(dict(arguments), meta.get(wire.KEY_META)))
        return await super().call_tool(name, arguments, context)


def shop_server(shop: Shop, **options: Any) -> RecordingServer:
    server = RecordingServer("shop", shop)

    @server.tool()
    @idempotent(MemoryKeyStore(), **options)
    async def charge(order: str, cents: int) -> str:
        shop.ledger.append(order)
        return f"charged {cents} for {order}"

    @server.tool()
    @idempotent(MemoryKeyStore())
    async def plain(order: str) -> str:
        shop.ledger.append(order)
        return f"done {order}"

    return server


def status(result: CallToolResult) -> object:
    entry = (result.meta or {}).get(wire.IDEMPOTENCY_META)
    assert isinstance(entry, dict), result
    return entry.get("status")


@pytest.mark.parametrize("keys", ["optional", "required"])
@pytest.mark.parametrize("path", PATHS)
async def test_the_key_travels_in_the_argument_on_every_attempt_over_a_lossy_link(
    path: str, keys: str
) -> None:
    shop = Shop()
    server = shop_server(shop, key_argument=path, keys=keys)
    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK, 2: None}, tools={"charge"}), seed=7)
    async with Client(chaos.wrap(server)) as client:
        rs = RetryingSession(client, policy=POLICY)
        result, report = await rs.call_tool_with_report("charge", {"order": "o-1", "cents": 5})
        await chaos.settled()
    assert [f.kind for f in chaos.faults] == [Fault.LOST_ACK]
    assert shop.ledger == ["o-1"]  # 0 duplicates
    assert len(report.attempts) == 2 and report.replayed and status(result) == "replayed"
    assert len(shop.arrivals) == 2
    for arrival in shop.arrivals:
        assert at(arrival.arguments, path) == report.key
        assert arrival.meta_key == report.key


@pytest.mark.parametrize("path", PATHS)
async def test_a_key_the_caller_puts_in_the_argument_is_the_calls_key(path: str) -> None:
    shop = Shop()
    server = shop_server(shop, key_argument=path)
    arguments = with_key(path, "model-key-1", {"order": "o-1", "cents": 5})
    async with Client(server) as client:
        rs = RetryingSession(client, policy=POLICY)
        first, report = await rs.call_tool_with_report("charge", arguments)
        again, _ = await rs.call_tool_with_report("charge", arguments)
        other, _ = await rs.call_tool_with_report(
            "charge", with_key(path, "model-key-2", {"order": "o-1", "cents": 5})
        )
    assert report.key == "model-key-1"
    assert shop.ledger == ["o-1", "o-1"]
    assert (status(first), status(again), status(other)) == ("executed", "replayed", "executed")
    assert [a.meta_key for a in shop.arrivals] == ["model-key-1", "model-key-1", "model-key-2"]
    assert arguments == with_key(path, "model-key-1", {"order": "o-1", "cents": 5})  # untouched


async def test_an_argument_key_agreeing_with_idempotency_key_is_one_key() -> None:
    shop = Shop()
    server = shop_server(shop, key_argument="idempotency_key")
    async with Client(server) as client:
        rs = RetryingSession(client, policy=POLICY)
        arguments = {"order": "o", "cents": 1, "idempotency_key": "k"}
        _, report = await rs.call_tool_with_report("charge", arguments, idempotency_key="k")
    assert report.key == "k" and shop.ledger == ["o"]


@pytest.mark.parametrize(
    ("kwargs", "argument", "message"),
    [
        ({"idempotency_key": "k-a"}, "k-b", "idempotency_key and arguments.+disagree"),
        ({"meta": {wire.KEY_META: "k-a"}}, "k-b", "meta.+ and arguments.+disagree"),
        ({}, "", r"arguments\['idempotency_key'\]: .*must not be empty"),
        ({}, 7, r"arguments\['idempotency_key'\]: .*must be a string"),
        ({}, "a\nb", r"arguments\['idempotency_key'\]: .*printable ASCII"),
    ],
)
async def test_a_bad_or_disagreeing_argument_key_is_refused_before_sending(
    kwargs: dict[str, Any], argument: object, message: str
) -> None:
    shop = Shop()
    server = shop_server(shop, key_argument="idempotency_key")
    async with Client(server) as client:
        rs = RetryingSession(client, policy=POLICY)
        with pytest.raises(ValueError, match=message):
            await rs.call_tool(
                "charge", {"order": "o", "cents": 1, "idempotency_key": argument}, **kwargs
            )
    assert shop.arrivals == [] and shop.ledger == []


async def test_a_tool_listed_without_a_key_argument_gets_the_arguments_as_given() -> None:
    shop = Shop()
    server = shop_server(shop, key_argument="idempotency_key")
    async with Client(server) as client:
        rs = RetryingSession(client, policy=POLICY)
        _, report = await rs.call_tool_with_report("plain", {"order": "o"})
    assert [a.arguments for a in shop.arrivals] == [{"order": "o"}]
    assert shop.arrivals[0].meta_key == report.key


async def test_a_connect_session_adopts_a_key_it_finds_in_the_arguments_on_its_first_call() -> None:
    """With `connect=` and no session yet, the listing comes only with the first attempt: a key
    found then in the arguments is still the caller's, not a second one."""
    shop = Shop()
    server = shop_server(shop, key_argument="idempotency_key")
    arguments = {"order": "o", "cents": 1, "idempotency_key": "late-key"}
    async with RetryingSession(connect=lambda: Client(server), policy=POLICY) as rs:
        _, report = await rs.call_tool_with_report("charge", arguments)
        again, _ = await rs.call_tool_with_report("charge", arguments)
    assert report.key == "late-key" and status(again) == "replayed"
    assert [a.meta_key for a in shop.arrivals] == ["late-key", "late-key"]
    assert shop.ledger == ["o"]


async def test_a_resumed_run_sends_the_same_key_in_the_argument_and_does_not_diverge() -> None:
    """A run's journal fingerprints the caller's arguments, before the key is put in them, so
    the resumed call matches its entry and goes out under the same key, in both places."""
    shop = Shop()
    server = shop_server(shop, key_argument="idempotency_key")
    journal = MemoryJournal()
    async with Client(server) as client:
        with pytest.raises(RuntimeError, match="crash"):
            async with Run("r", journal=journal) as run:
                await RetryingSession(client, run=run).call_tool(
                    "charge", {"order": "o", "cents": 1}
                )
                raise RuntimeError("crash")
        async with Run("r", journal=journal) as run:
            rs = RetryingSession(client, run=run)
            again, _ = await rs.call_tool_with_report("charge", {"order": "o", "cents": 1})
    assert status(again) == "replayed" and shop.ledger == ["o"]
    keys = [(a.arguments["idempotency_key"], a.meta_key) for a in shop.arrivals]
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0][0] == keys[0][1]


async def test_the_early_listing_skips_a_discarded_session() -> None:
    """A session put aside with `discard` (a request sent on it directly found it gone: a
    server that forgot it answers 404) gets nothing more: the listing that learns the key
    argument is left to the attempt, on the new session. (It went to the discarded one first,
    which answered the forgotten session's 404 once more.)"""
    shop = Shop()
    server = shop_server(shop, key_argument="idempotency_key")
    listed: list[Client] = []

    class Noting(Client):
        async def list_tools(self, *args: Any, **kwargs: Any) -> Any:
            listed.append(self)
            return await super().list_tools(*args, **kwargs)

    arguments = {"order": "o", "cents": 1, "idempotency_key": "k"}
    async with RetryingSession(connect=lambda: Noting(server), policy=POLICY) as rs:
        old = await rs.live_session()
        rs.discard(old)
        _, report = await rs.call_tool_with_report("charge", arguments)
        new = rs.session
    assert new is not old
    assert ["discarded" if c is old else "new" if c is new else "?" for c in listed] == ["new"]
    assert report.key == "k" and shop.ledger == ["o"]
