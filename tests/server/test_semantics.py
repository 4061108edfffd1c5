"""What a guarded tool does with exceptions, refusals, input rounds, keyless calls and scopes —
compared against the same tool unguarded wherever the contract says "as the SDK would"."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
from mcp import MCPError
from mcp.client import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, InputRequiredResult, TextContent
from server_kit import SOON, Effects, answer, body, caller_gave_up, effect_server, marker, meta

from idempotency import CallScope, MemoryKeyStore, default_scope, idempotent, wire
from idempotency._guard.guard import Guard, ToolCall
from idempotency._guard.policy import Policy

pytestmark = pytest.mark.anyio


class Declined(Exception):
    """The payment provider refused before charging (declared effect-free)."""


def failing_servers(raise_: BaseException, **options: Any) -> tuple[MCPServer, MCPServer, Effects]:
    """The same failing tool, guarded and plain; `effects.count` counts attempts of the effect."""
    effects = Effects()
    guarded, plain = MCPServer("shop"), MCPServer("shop")

    async def pay(order: str) -> str:
        effects.count += 1
        if effects.count == 1:
            raise raise_
        return f"paid {order} on try {effects.count}"

    guarded.tool()(idempotent(MemoryKeyStore(), **options)(pay))
    plain.tool()(pay)
    return guarded, plain, effects


@pytest.mark.parametrize(
    "exc",
    [RuntimeError("db password in traceback"), ToolError("card expired")],
    ids=["crash", "tool-error"],
)
async def test_exception_is_stored_as_error_result_and_replayed(exc: Exception) -> None:
    guarded, plain, effects = failing_servers(exc)
    async with Client(guarded) as client, Client(plain) as unguarded:
        first = await client.call_tool("pay", {"order": "A"}, meta=meta("e1"))
        retry = await client.call_tool("pay", {"order": "A"}, meta=meta("e1"))
        effects.count = 0
        reference = await unguarded.call_tool("pay", {"order": "A"})
    assert first.is_error is True
    assert body(first) == body(reference)  # the SDK's own rendering, text included
    assert marker(first)["status"] == "executed"
    assert marker(retry)["status"] == "replayed"
    assert answer(retry) == answer(first)


async def test_effect_free_exception_releases_the_claim() -> None:
    guarded, plain, effects = failing_servers(Declined("try later"), effect_free=Declined)
    async with Client(guarded) as client, Client(plain) as unguarded:
        first = await client.call_tool("pay", {"order": "A"}, meta=meta("e2"))
        retry = await client.call_tool("pay", {"order": "A"}, meta=meta("e2"))
        replay = await client.call_tool("pay", {"order": "A"}, meta=meta("e2"))
        effects.count = 0
        reference = await unguarded.call_tool("pay", {"order": "A"})
    assert body(first) == body(reference)  # propagated exactly as the SDK renders it
    assert wire.IDEMPOTENCY_META not in (first.meta or {})
    assert body(retry)["content"][0]["text"] == "paid A on try 2"
    assert marker(retry)["status"] == "executed"
    assert marker(retry)["attempts"] == 2
    assert answer(replay) == answer(retry)


async def test_mcp_error_from_the_tool_is_a_refusal_and_releases_the_claim() -> None:
    refusal = MCPError(wire.INVALID_PARAMS, "order is frozen", {"order": "A"})
    guarded, _, effects = failing_servers(refusal)
    async with Client(guarded) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("pay", {"order": "A"}, meta=meta("e3"))
        retry = await client.call_tool("pay", {"order": "A"}, meta=meta("e3"))
    assert caught.value.code == wire.INVALID_PARAMS
    assert caught.value.error.data == {"order": "A"}
    assert effects.count == 2
    assert marker(retry)["status"] == "executed"


async def test_input_required_rounds_are_never_stored() -> None:
    store = MemoryKeyStore()
    guard = Guard(store, Policy())
    question = InputRequiredResult(request_state="round-1")
    answered = CallToolResult(content=[TextContent(type="text", text="done")])
    rounds = iter([question, answered])
    calls = 0

    async def execute() -> Any:
        nonlocal calls
        calls += 1
        return next(rounds)

    call = ToolCall(server="s", tool="t", arguments={"x": 1}, meta={wire.KEY_META: "ir"})

    def never(exc: Exception) -> CallToolResult:
        raise AssertionError(exc)

    async def unprotected() -> Any:
        raise AssertionError("a keyed call was passed through")

    def guarded() -> Any:
        return guard.call(
            call,
            execute,
            error_result=never,
            takeover=False,
            passthrough=unprotected,
            render=lambda answer: answer,
        )

    first = await guarded()
    assert first is question
    assert await store.list_records() == []
    second = await guarded()
    third = await guarded()
    assert calls == 2
    assert isinstance(second, CallToolResult) and isinstance(third, CallToolResult)
    assert marker(second)["status"] == "executed"
    assert marker(third)["status"] == "replayed"


async def test_optional_keys_leave_keyless_calls_exactly_as_unwrapped() -> None:
    store = MemoryKeyStore()
    guarded_effects, plain_effects = Effects(), Effects()
    guarded = effect_server(store, guarded_effects, gated=False, keys="optional")
    plain = MCPServer("shop")

    @plain.tool()
    async def charge(order: str, cents: int) -> str:
        plain_effects.count += 1
        return f"charged {cents} for {order} (execution {plain_effects.count})"

    args = {"order": "A", "cents": 1}
    async with Client(guarded) as client, Client(plain) as unguarded:
        ours = [await client.call_tool("charge", args) for _ in range(2)]
        theirs = [await unguarded.call_tool("charge", args) for _ in range(2)]
    assert guarded_effects.count == plain_effects.count == 2
    assert [r.model_dump(by_alias=True) for r in ours] == [
        r.model_dump(by_alias=True) for r in theirs
    ]
    assert await store.list_records() == []


async def test_derived_keys_merge_a_keyless_resend_within_their_window_never_a_repeat() -> None:
    """Rule 15: an identical keyless call after a delivered answer is a repeat and runs; after
    an answer its caller gave up on, a re-send, replayed while the window lasts; a client key
    replays whatever the delivery."""
    clock_now = [1_750_000_000.0]
    store = MemoryKeyStore(clock=lambda: clock_now[0])
    effects = Effects()
    server = effect_server(store, effects, gated=False)
    args = {"order": "A", "cents": 1}
    # One connection (in-memory, handshake era): the caller a derived key is bound to.
    async with Client(server, mode="legacy") as client:
        first = await client.call_tool("charge", args)
        repeat = await client.call_tool("charge", args)
        assert await caller_gave_up(store) == 1  # the repeat's answer never reached its caller
        resend = await client.call_tool("charge", args)
        again = await client.call_tool("charge", args)  # the re-send's answer was delivered
        other = await client.call_tool("charge", {"order": "B", "cents": 1})
        keyed = await client.call_tool("charge", args, meta=meta("client-key"))
        await caller_gave_up(store)
        clock_now[0] += 601  # past the 10-minute derived window, inside the 24 h one
        later = await client.call_tool("charge", args)
        keyed_later = await client.call_tool("charge", args, meta=meta("client-key"))
    assert marker(first)["keySource"] == "derived"
    assert marker(first)["key"].startswith("derived-")
    assert marker(repeat)["status"] == "executed" and answer(repeat) != answer(first)
    assert marker(repeat)["key"] == marker(first)["key"]
    assert marker(resend)["status"] == "replayed"
    assert answer(resend) == answer(repeat)
    assert marker(again)["status"] == "executed"
    assert marker(other)["key"] != marker(first)["key"]
    assert marker(keyed)["status"] == "executed"
    assert marker(later)["status"] == "executed"
    assert marker(keyed_later)["status"] == "replayed"
    assert effects.count == 6


async def test_sync_tool_and_tool_with_context_are_guarded() -> None:
    store = MemoryKeyStore()
    server = MCPServer("shop")
    runs: list[str] = []

    @server.tool()
    @idempotent(store)
    def sync_charge(order: str) -> str:
        runs.append(order)
        return f"sync {order}"

    @server.tool()
    @idempotent(store)
    async def ctx_charge(order: str, ctx: Context) -> str:
        runs.append(order)
        request_meta = ctx.request_context.meta or {}
        return f"ctx {order} key={request_meta.get(wire.KEY_META)}"

    async with Client(server) as client:
        a = [await client.call_tool("sync_charge", {"order": "s"}, meta=meta("k")) for _ in "12"]
        b = [await client.call_tool("ctx_charge", {"order": "c"}, meta=meta("k")) for _ in "12"]
    assert runs == ["s", "c"]
    assert body(a[1])["content"][0]["text"] == "sync s"
    assert body(b[1])["content"][0]["text"] == "ctx c key=k"
    assert [marker(r)["status"] for r in a + b] == ["executed", "replayed"] * 2


async def test_direct_call_outside_a_request_runs_unguarded() -> None:
    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects, gated=False)
    first = await server.call_tool("charge", {"order": "A", "cents": 1})
    second = await server.call_tool("charge", {"order": "A", "cents": 1})
    assert effects.count == 2
    assert isinstance(first, CallToolResult) and isinstance(second, CallToolResult)
    assert wire.IDEMPOTENCY_META not in (first.meta or {})


async def test_custom_scope_separates_tenants_named_in_meta() -> None:
    def tenant_scope(call: CallScope) -> str:
        return f"{default_scope(call)}|{(call.meta or {}).get('example.com/tenant')}"

    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects, gated=False, scope=tenant_scope)
    args = {"order": "A", "cents": 1}
    async with Client(server) as client:
        a1 = await client.call_tool(
            "charge", args, meta=meta("same", **{"example.com/tenant": "a"})
        )
        b1 = await client.call_tool(
            "charge", args, meta=meta("same", **{"example.com/tenant": "b"})
        )
        a2 = await client.call_tool(
            "charge", args, meta=meta("same", **{"example.com/tenant": "a"})
        )
    assert effects.count == 2
    assert body(b1) != body(a1)
    assert marker(b1)["status"] == "executed"
    assert answer(a2) == answer(a1)


async def test_logs_never_carry_arguments_or_results(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "4111-1111-1111-1111"
    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects, wait=0, max_result_bytes=200)
    with anyio.fail_after(SOON):
        async with Client(server) as client, anyio.create_task_group() as tg:

            async def first() -> None:
                await client.call_tool("charge", {"order": secret * 20, "cents": 1}, meta=meta("k"))

            tg.start_soon(first)
            await effects.started.wait()
            for other in ({"order": secret, "cents": 2}, {"order": secret * 20, "cents": 1}):
                with pytest.raises(MCPError):
                    await client.call_tool("charge", other, meta=meta("k"))
            effects.open()
    ours = [r for r in caplog.records if r.name.startswith("idempotency")]
    assert ours, "the guard logged nothing at all"
    for record in ours:
        assert secret not in record.getMessage()


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_guard_runs_under_asyncio_and_trio(anyio_backend: str) -> None:
    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects)
    results: list[Any] = []
    with anyio.fail_after(SOON):
        async with Client(server, mode="legacy") as client, anyio.create_task_group() as tg:

            async def call() -> None:
                results.append(
                    await client.call_tool("charge", {"order": "t", "cents": 1}, meta=meta("t"))
                )

            for _ in range(3):
                tg.start_soon(call)
            await effects.started.wait()
            effects.open()
    assert effects.count == 1
    assert len({str(answer(r)) for r in results}) == 1
