"""mcp-once's own client, `RetryingSession` over a plain `mcp.Client`, against both servers, over
stdio and streamable HTTP in both protocol eras.

It reads each tool's listing: where the listing names a key argument (`keyArgument`), it puts
the call's key there as well as in `_meta`, and a key the caller already put there is the call's
key. So what it can do differs from the plain clients, and the legs are:
- the caller's key in the argument (flat and nested): 1 effect, the second answer replayed; a
  new key: 2 effects (the shared legs);
- no key from the caller: it mints one per call, so two calls are two actions, each protected
  (there is no keyless control: it never sends a call without a key);
- `_meta` and argument keys that differ, or a bad argument key: `ValueError` before anything is
  sent (its documented behaviour), so the server sees nothing; equal keys are one key;
- the `Idempotency-Key` header (set on its HTTP client): the header is one more place, so the
  server requires it to agree with the key RetryingSession sends. Pass the header's value as
  `idempotency_key=` and the call is deduplicated; leave it out and RetryingSession's own key
  disagrees with the header: -32602 (`ToolCallError`), nothing run. Where the server ignores
  headers, the header changes nothing.
"""

from __future__ import annotations

import httpx2
import pytest
from mcp import Client, MCPError
from real_clients_kit import (
    HEADER,
    KEY_ARGUMENT,
    PYTHON_SETTINGS,
    Call,
    Caller,
    LegFailures,
    Outcome,
    Served,
    charge,
    fresh,
    meta_and_argument_agree,
    meta_key,
    nested_argument_key_twice,
    new_argument_key,
    nothing_written,
    outcome_of,
    python_client,
    refusal,
    same_argument_key_twice,
    served_in,
    set_header,
)

from idempotency import wire
from orchestrator import RetryingSession, RetryPolicy, ToolCallError

pytestmark = pytest.mark.anyio

POLICY = RetryPolicy(max_attempts=3, attempt_timeout=30.0, deadline=60.0)


class RetryingCaller(Caller):
    def __init__(self, client: Client, http: httpx2.AsyncClient | None) -> None:
        self.session = RetryingSession(client, policy=POLICY)
        self.http = http

    async def send(self, call: Call) -> Outcome:
        return await self.keyed(call, None)

    async def keyed(self, call: Call, idempotency_key: str | None) -> Outcome:
        """`call` with `idempotency_key=` (None: the session's own choice)."""
        set_header(self.http, call.header)
        try:
            result = await self.session.call_tool(
                call.tool, call.arguments, meta=call.meta, idempotency_key=idempotency_key
            )
        except MCPError as error:
            return refusal(error)
        return outcome_of(result)


async def keys_every_call(caller: RetryingCaller, served: Served) -> None:
    """No key from the caller: a fresh key per call, so two calls are two protected actions."""
    order = fresh("minted")
    first = await caller.call("charge", charge(order))
    second = await caller.call("charge", charge(order))
    assert (ran := served.effects(order)) == 2, f"{ran} effects, expected 2"
    assert first.status == second.status == "executed", (first, second)
    assert first.marker is not None and second.marker is not None
    assert first.marker["key"] != second.marker["key"]


async def refuses_before_sending(caller: RetryingCaller, served: Served) -> None:
    """Keys that disagree, and a bad argument key: `ValueError`, and the server saw nothing."""
    order = fresh("local")
    before = await served.records()
    for arguments, meta in [
        (charge(order, fresh("a")), meta_key(fresh("b"))),
        (charge(order, ""), None),
        (charge(order, "k" * 256), None),
    ]:
        with pytest.raises(ValueError, match=KEY_ARGUMENT):
            await caller.call("charge", arguments, meta=meta)
    await nothing_written(served, before, order)


async def header_with_its_key(caller: RetryingCaller, served: Served) -> None:
    """The header's value passed as `idempotency_key=`: one key in every place, deduplicated."""
    order, key = fresh("hkey"), fresh("h")
    first = await caller.keyed(Call("charge", charge(order), header=key), key)
    again = await caller.keyed(Call("charge", charge(order), header=key), key)
    assert (ran := served.effects(order)) == 1, f"{ran} effects, expected 1"
    assert first.status == "executed" and again.status == "replayed", (first, again)


async def header_against_its_own_key(caller: RetryingCaller, served: Served) -> None:
    """A header beside RetryingSession's minted key: two keys, -32602 naming both, nothing run
    (and not retried: it is permanent)."""
    order = fresh("hmint")
    before = await served.records()
    with pytest.raises(ToolCallError) as refused:
        await caller.session.call_tool("charge", charge(order), meta=None)
    assert refused.value.code == wire.INVALID_PARAMS
    assert f"HTTP header '{HEADER}'" in refused.value.message
    assert refused.value.attempts == 1
    await nothing_written(served, before, order)


async def header_ignored_when_off(caller: RetryingCaller, served: Served) -> None:
    """The server ignores headers for this tool: RetryingSession's own keys protect each call."""
    order = fresh("hoff")
    first = await caller.call("charge_headerless", charge(order), header=fresh("h"))
    second = await caller.call("charge_headerless", charge(order), header=fresh("h"))
    assert (ran := served.effects(order)) == 2, f"{ran} effects, expected 2"
    assert first.status == second.status == "executed", (first, second)


@pytest.mark.parametrize("setting", PYTHON_SETTINGS)
@pytest.mark.parametrize("flavor", ["mcpserver", "fastmcp"])
async def test_retrying_session(flavor: str, setting: str, request: pytest.FixtureRequest) -> None:
    served = served_in(request, flavor, http=setting != "stdio")
    legs = [
        same_argument_key_twice,
        new_argument_key,
        nested_argument_key_twice,
        meta_and_argument_agree,
        keys_every_call,
        refuses_before_sending,
    ]
    failures = LegFailures()
    async with python_client(served, setting) as (client, http):
        await failures.run(legs, RetryingCaller(client, http), served)
        if http is not None:
            await failures.run(
                [header_with_its_key, header_ignored_when_off], RetryingCaller(client, http), served
            )
            http.headers[HEADER] = fresh("h")
            await failures.run([header_against_its_own_key], RetryingCaller(client, http), served)
    failures.check()
