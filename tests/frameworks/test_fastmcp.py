"""FastMCP's client: `RetryingSession(fastmcp.Client)` and `RetryingClient`, against real servers.

Each test loses the answer to the first call of one tool (stdio and streamable HTTP) and counts
the tool's executions in the server's ledger. FastMCP has no retry of its own: the baseline is
the retry loop a caller writes around `call_tool` when it sees the timeout.
"""

from __future__ import annotations

import pytest
from _kit import ATTEMPT_TIMEOUT, POLICY, Shop, lose_first_answer, settle
from fastmcp import Client
from fastmcp.client.client import CallToolResult as FastMCPResult
from mcp import MCPError
from mcp_types import REQUEST_TIMEOUT

from idempotency import wire
from orchestrator import OutcomeUnknown, RetryingSession
from orchestrator.chaos import Chaos
from orchestrator.fastmcp import RetryingClient, SDKStreamTransport

pytestmark = pytest.mark.anyio


def over(shop: Shop, chaos: Chaos) -> SDKStreamTransport:
    """A FastMCP transport to the shop through the chaos link (a new link per connection)."""
    return SDKStreamTransport(lambda: chaos.wrap(shop.connect()))


async def test_retrying_session_drives_a_connected_fastmcp_client(guarded_shop: Shop) -> None:
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    async with Client(over(guarded_shop, chaos)) as client:
        session = RetryingSession(client, policy=POLICY)
        result, report = await session.call_tool_with_report(
            "pay", {"call_id": call, "account": "acct", "cents": 100}
        )
    await settle(chaos)
    assert report.replayed and len(report.attempts) == 2
    assert (result.meta or {})[wire.IDEMPOTENCY_META]["status"] == "replayed"
    effects = guarded_shop.effects(call)
    assert len(effects) == 1 and effects[0].key == report.key  # one effect, the call's own key


async def test_retrying_client_replays_the_idempotent_tool(guarded_shop: Shop) -> None:
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    async with RetryingClient(over(guarded_shop, chaos), policy=POLICY) as client:
        result = await client.call_tool("pay", {"call_id": call, "account": "acct", "cents": 100})
    await settle(chaos)
    assert isinstance(result, FastMCPResult)  # FastMCP's own parsed result
    receipt = result.data.result  # parsed through the tool's output schema
    assert isinstance(receipt, str) and receipt.startswith("receipt ")
    assert (result.meta or {})[wire.IDEMPOTENCY_META]["status"] == "replayed"
    effects = guarded_shop.effects(call)
    assert len(effects) == 1
    assert effects[0].result == receipt  # the replay is the first execution's answer
    assert chaos.requests_seen == 2  # sent twice, with one key, run once


async def test_retrying_client_does_not_resend_a_non_idempotent_tool(plain_shop: Shop) -> None:
    chaos = lose_first_answer("notify")
    call = plain_shop.call_id()
    async with RetryingClient(over(plain_shop, chaos), policy=POLICY) as client:
        with pytest.raises(OutcomeUnknown) as caught:
            await client.call_tool("notify", {"call_id": call, "message": "hi"})
    await settle(chaos)
    assert caught.value.tool == "notify" and caught.value.reason == "not_idempotent"
    assert chaos.requests_seen == 1  # never re-sent
    assert len(plain_shop.effects(call)) == 1


async def test_without_mcp_once_a_callers_retry_duplicates(plain_shop: Shop) -> None:
    """The baseline: a plain `fastmcp.Client` only says "timeout"; retrying it runs twice."""
    chaos = lose_first_answer("notify")
    call = plain_shop.call_id()
    async with Client(over(plain_shop, chaos), timeout=ATTEMPT_TIMEOUT) as client:
        for _ in range(2):
            try:
                await client.call_tool("notify", {"call_id": call, "message": "hi"})
                break
            except MCPError as error:
                assert error.code == REQUEST_TIMEOUT
    await settle(chaos)
    assert len(plain_shop.effects(call)) == 2


async def test_retrying_client_uses_a_key_from_meta(guarded_shop: Shop) -> None:
    """A caller's key (how pydantic-ai's tool-call ids arrive) is the key of every attempt."""
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    key = f"order-{call}"
    async with RetryingClient(over(guarded_shop, chaos), policy=POLICY) as client:
        args = {"call_id": call, "account": "acct", "cents": 100}
        await client.call_tool("pay", args, meta={wire.KEY_META: key})
        again = await client.call_tool("pay", args, meta={wire.KEY_META: key})
    await settle(chaos)
    assert (again.meta or {})[wire.IDEMPOTENCY_META]["key"] == key
    assert [effect.key for effect in guarded_shop.effects(call)] == [key]


async def test_without_mcp_once_a_guarded_server_merges_only_what_it_can_attribute(
    guarded_shop: Shop,
) -> None:
    """A caller's keyless retry of `pay`: merged by a derived key on the same stdio connection;
    over streamable HTTP (no caller identity) the payment runs twice."""
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    args = {"call_id": call, "account": "acct", "cents": 100}
    async with Client(over(guarded_shop, chaos), timeout=ATTEMPT_TIMEOUT) as client:
        for _ in range(2):
            try:
                await client.call_tool("pay", args)
                break
            except MCPError as error:
                assert error.code == REQUEST_TIMEOUT
    await settle(chaos)
    assert len(guarded_shop.effects(call)) == (1 if guarded_shop.transport == "stdio" else 2)
