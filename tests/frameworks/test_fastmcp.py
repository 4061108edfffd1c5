"""FastMCP's client: `RetryingSession(fastmcp.Client)` and `RetryingClient`, against real servers.

Each test loses the answer to the first call of one tool (stdio and streamable HTTP) and counts
the tool's executions in the server's ledger. FastMCP has no retry of its own: the baseline is
the retry loop a caller writes around `call_tool` when it sees the timeout.
"""

from __future__ import annotations

from typing import Any

import pytest
from _kit import (
    ATTEMPT_TIMEOUT,
    POLICY,
    Shop,
    executions,
    fastmcp_over,
    lose_first_answer,
    notify_args,
    pay_args,
    replayed_once,
    sent_once,
)
from fastmcp import Client
from fastmcp.client.client import CallToolResult as FastMCPResult
from mcp import MCPError
from mcp_types import REQUEST_TIMEOUT

from idempotency import wire
from orchestrator import OutcomeUnknown, RetryingSession, key_step, step_key_from, step_keys
from orchestrator.chaos import Chaos, Fault, FaultPlan
from orchestrator.fastmcp import RetryingClient, SDKStreamTransport

pytestmark = pytest.mark.anyio


async def callers_retry(transport: SDKStreamTransport, tool: str, args: dict[str, Any]) -> None:
    """What a caller of a plain `fastmcp.Client` writes: call again after a timeout (once)."""
    async with Client(transport, timeout=ATTEMPT_TIMEOUT) as client:
        for _ in range(2):
            try:
                await client.call_tool(tool, args)
                return
            except MCPError as error:
                assert error.code == REQUEST_TIMEOUT


async def test_retrying_session_drives_a_connected_fastmcp_client(guarded_shop: Shop) -> None:
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    async with Client(fastmcp_over(guarded_shop, chaos)) as client:
        session = RetryingSession(client, policy=POLICY)
        result, report = await session.call_tool_with_report("pay", pay_args(call))
    effect = await replayed_once(guarded_shop, call, chaos)
    assert report.replayed and len(report.attempts) == 2
    assert (result.meta or {})[wire.IDEMPOTENCY_META]["status"] == "replayed"
    assert effect.key == report.key  # the call's own key, on both attempts


async def test_retrying_client_replays_the_idempotent_tool(guarded_shop: Shop) -> None:
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    async with RetryingClient(fastmcp_over(guarded_shop, chaos), policy=POLICY) as client:
        result = await client.call_tool("pay", pay_args(call))
    effect = await replayed_once(guarded_shop, call, chaos)
    assert isinstance(result, FastMCPResult)  # FastMCP's own parsed result
    receipt = result.data.result  # parsed through the tool's output schema
    assert isinstance(receipt, str) and receipt.startswith("receipt ")
    assert (result.meta or {})[wire.IDEMPOTENCY_META]["status"] == "replayed"
    assert effect.result == receipt  # the replay is the first execution's answer


async def test_retrying_client_does_not_resend_a_non_idempotent_tool(plain_shop: Shop) -> None:
    chaos = lose_first_answer("notify")
    call = plain_shop.call_id()
    async with RetryingClient(fastmcp_over(plain_shop, chaos), policy=POLICY) as client:
        with pytest.raises(OutcomeUnknown) as caught:
            await client.call_tool("notify", notify_args(call))
    await sent_once(plain_shop, call, chaos)
    assert caught.value.tool == "notify" and caught.value.reason == "not_idempotent"


async def test_without_mcp_once_a_callers_retry_duplicates(plain_shop: Shop) -> None:
    """The baseline: a plain `fastmcp.Client` only says "timeout"; retrying it runs twice."""
    chaos = lose_first_answer("notify")
    call = plain_shop.call_id()
    await callers_retry(fastmcp_over(plain_shop, chaos), "notify", notify_args(call))
    assert len(await executions(plain_shop, call, chaos)) == 2


async def test_retrying_client_uses_a_key_from_meta(guarded_shop: Shop) -> None:
    """A caller's key (how pydantic-ai's tool-call ids arrive) is the key of every attempt."""
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    key = f"order-{call}"
    async with RetryingClient(fastmcp_over(guarded_shop, chaos), policy=POLICY) as client:
        args = pay_args(call)
        await client.call_tool("pay", args, meta={wire.KEY_META: key})
        again = await client.call_tool("pay", args, meta={wire.KEY_META: key})
    assert (again.meta or {})[wire.IDEMPOTENCY_META]["key"] == key
    assert [effect.key for effect in await executions(guarded_shop, call, chaos)] == [key]


async def test_retrying_client_takes_keys_from_its_key_source(guarded_shop: Shop) -> None:
    """`key_source=` reaches the client's sessions (and `new()` clones): inside a step, the
    step's key for the call's ordinal is the key of every attempt."""
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    client = RetryingClient(fastmcp_over(guarded_shop, chaos), policy=POLICY, key_source=step_keys)
    assert client.new().key_source is step_keys
    with key_step("wf-1", "run-1", "act-1"):
        async with client:
            await client.call_tool("pay", pay_args(call))
    effect = await replayed_once(guarded_shop, call, chaos)
    assert effect.key == step_key_from("wf-1", "run-1", "act-1", ordinal=0)


async def test_without_mcp_once_a_guarded_server_merges_only_what_it_can_attribute(
    guarded_shop: Shop,
) -> None:
    """A caller's keyless retry of `pay`: merged by a derived key on the same stdio connection;
    over streamable HTTP (no caller identity) the payment runs twice."""
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    await callers_retry(fastmcp_over(guarded_shop, chaos), "pay", pay_args(call))
    effects = await executions(guarded_shop, call, chaos)
    assert len(effects) == (1 if guarded_shop.transport == "stdio" else 2)


async def test_retrying_session_replaces_a_dead_fastmcp_client(plain_shop: Shop) -> None:
    """With `connect=` making `fastmcp.Client`s, a link that dies after the request was written
    is replaced and the (idempotent) call retried on the new one: reconnection as for the SDK."""
    chaos = Chaos(FaultPlan(schedule={1: Fault.CLOSE_AFTER_WRITE}, tools={"set_value"}), seed=3)
    call = plain_shop.call_id()

    def connect() -> Client[SDKStreamTransport]:
        return Client(fastmcp_over(plain_shop, chaos))

    async with RetryingSession(connect=connect, policy=POLICY) as session:
        args = {"call_id": call, "name": "n", "value": 1}
        result, report = await session.call_tool_with_report("set_value", args)
    assert not result.is_error
    assert report.connects == 2 and len(report.attempts) == 2  # first connect + a replacement
    assert report.attempts[0].failure == "maybe_executed"
    assert 1 <= len(await executions(plain_shop, call, chaos)) <= 2  # idempotent: at least once
