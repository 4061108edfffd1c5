"""The server contract's scenarios through a FastMCP server guarded by `IdempotencyMiddleware`, in
process (memory streams) and over streamable HTTP on 127.0.0.1. Effects are counted by the tool
body itself (`Effects`), outside anything the guard returns."""

from __future__ import annotations

import base64
from typing import Any

import anyio
import pytest
from fake_clock import FakeClock
from fastmcp import FastMCP
from fastmcp.server.auth.providers.jwt import StaticTokenVerifier
from fastmcp.tools.base import ToolResult
from fastmcp_kit import TRANSPORTS, charge_server, promise, serving
from mcp import MCPError
from mcp_types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)
from server_kit import (
    DownStore,
    Effects,
    answer,
    body,
    burst,
    caller_gave_up,
    lose_the_lease,
    marker,
    meta,
)

from idempotency import KeyStore, MemoryKeyStore, wire
from idempotency.fastmcp import IdempotencyMiddleware

pytestmark = pytest.mark.anyio

ARGS: dict[str, Any] = {"order": "o-1", "cents": 500}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_lost_ack_runs_once_and_the_retry_is_a_replay(
    store: KeyStore, transport: str
) -> None:
    """The caller gives up mid-call and its connection goes; the tool finishes its effect anyway;
    a new connection re-sends the key and gets the first answer, marked replayed."""
    effects = Effects()
    server = charge_server(store, effects)
    async with serving(server, transport) as connect:
        async with anyio.create_task_group() as tg:

            async def first() -> None:
                async with connect() as client:
                    await client.call_tool_mcp("charge", ARGS, meta=meta("lost-ack"))

            tg.start_soon(first)
            await effects.started.wait()
            tg.cancel_scope.cancel()
            effects.open()
        await effects.done.wait()
        async with connect() as client:
            retry = await client.call_tool_mcp("charge", ARGS, meta=meta("lost-ack"))
            again = await client.call_tool_mcp("charge", ARGS, meta=meta("lost-ack"))
    assert effects.count == 1
    assert effects.cancelled == 0
    assert body(retry)["content"] == [{"type": "text", "text": "charged 500 for o-1 (execution 1)"}]
    assert marker(retry)["status"] == "replayed"
    assert marker(retry)["keySource"] == "client" and marker(retry)["attempts"] == 1
    assert answer(again) == answer(retry)


async def test_a_record_written_for_one_era_replays_to_the_other() -> None:
    effects = Effects()
    server = charge_server(MemoryKeyStore(), effects, gated=False)
    async with (
        serving(server, "http") as connect,
        connect(mode="legacy") as legacy,
        connect() as modern,
    ):
        first = await legacy.call_tool_mcp("charge", ARGS, meta=meta("era"))
        replay = await modern.call_tool_mcp("charge", ARGS, meta=meta("era"))
    assert effects.count == 1
    assert marker(replay)["status"] == "replayed"
    assert answer(replay) == answer(first)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_fifty_concurrent_calls_one_execution(store: KeyStore, transport: str) -> None:
    effects = Effects()
    server = charge_server(store, effects)
    async with serving(server, transport) as connect, connect() as client:
        results = await burst(
            lambda: client.call_tool_mcp("charge", ARGS, meta=meta("burst")), effects
        )
    assert effects.count == 1
    assert len(results) == 50
    assert sorted(marker(r)["status"] for r in results) == ["executed"] + ["replayed"] * 49
    assert all(answer(r) == answer(results[0]) for r in results)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_same_key_other_arguments_is_key_reused(transport: str) -> None:
    effects = Effects()
    server = charge_server(MemoryKeyStore(), effects, gated=False)
    async with serving(server, transport) as connect, connect() as client:
        await client.call_tool_mcp("charge", ARGS, meta=meta("reuse"))
        with pytest.raises(MCPError) as caught:
            await client.call_tool_mcp("charge", {**ARGS, "cents": 501}, meta=meta("reuse"))
    assert caught.value.code == wire.KEY_REUSED
    assert caught.value.error.data == {"key": "reuse"}
    assert effects.count == 1


@pytest.mark.parametrize(
    "key",
    [42, "", "k" * 256, "tab\tkey", "clé"],
    ids=["int", "empty", "too-long", "tab", "non-ascii"],
)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_malformed_key_is_invalid_params_and_the_tool_does_not_run(
    transport: str, key: object
) -> None:
    effects = Effects()
    server = charge_server(MemoryKeyStore(), effects, gated=False)
    async with serving(server, transport) as connect, connect() as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool_mcp("charge", ARGS, meta=meta(key))
    assert caught.value.code == wire.INVALID_PARAMS
    assert "reason" in caught.value.error.data
    assert effects.count == 0


async def test_missing_key_where_required_is_invalid_params() -> None:
    effects = Effects()
    server = charge_server(MemoryKeyStore(), effects, gated=False, keys="required")
    async with serving(server, "memory") as connect, connect() as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool_mcp("charge", ARGS)
    assert caught.value.code == wire.INVALID_PARAMS
    assert caught.value.error.data == {"reason": "missing"}
    assert effects.count == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_store_down_is_store_unavailable_and_the_tool_does_not_run(transport: str) -> None:
    effects = Effects()
    server = charge_server(DownStore(), effects, gated=False)
    async with serving(server, transport) as connect, connect() as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool_mcp("charge", ARGS, meta=meta("k"))
    assert caught.value.code == wire.STORE_UNAVAILABLE
    assert caught.value.error.data == {"key": "k"}
    assert effects.count == 0


@pytest.mark.parametrize(
    ("options", "other_takes_over", "code"),
    [
        ({}, False, wire.OUTCOME_UNKNOWN),
        ({"naturally_idempotent": True}, True, wire.IN_PROGRESS),
    ],
    ids=["declared-lost", "taken-over"],
)
async def test_lease_lost_mid_tool_stops_it(
    options: dict[str, Any], other_takes_over: bool, code: int
) -> None:
    """The store's clock says the lease ran out and another worker claims the record: the next
    renewal finds the claim gone and cancels the tool, which never reaches its effect."""
    clock = FakeClock()
    store = MemoryKeyStore(clock=clock)
    effects = Effects()
    server = charge_server(store, effects, lease=0.3, **options)
    async with serving(server, "memory") as connect, connect() as client:
        errors = await lose_the_lease(
            lambda: client.call_tool_mcp("charge", ARGS, meta=meta("fragile")),
            effects,
            store,
            clock,
            key="fragile",
            args=ARGS,
            takeover=other_takes_over,
        )
    assert effects.cancelled == 1 and effects.count == 0
    assert [e.code for e in errors] == [code]


class Tenants(StaticTokenVerifier):
    """`Bearer tenant-a` and `Bearer tenant-b`: two principals."""

    def __init__(self) -> None:
        super().__init__({f"tenant-{t}": {"client_id": t, "scopes": []} for t in "ab"})


async def test_two_bearer_principals_never_see_each_others_results() -> None:
    """FastMCP's own authentication: the access token it verified scopes every key, client keys
    and derived ones alike."""
    opened: list[str] = []
    server: FastMCP[Any] = FastMCP("bank", auth=Tenants())
    store = MemoryKeyStore()
    server.add_middleware(IdempotencyMiddleware(store))

    @server.tool
    async def open_account(owner: str) -> str:
        opened.append(owner)
        return f"account #{len(opened)} for {owner}"

    async def call_as(tenant: str, key: str | None, owner: str) -> CallToolResult:
        async with connect(auth=f"tenant-{tenant}") as client:
            return await client.call_tool_mcp(
                "open_account", {"owner": owner}, meta=None if key is None else meta(key)
            )

    async with serving(server, "http") as connect:
        a_first = await call_as("a", "shared-key", "same")
        b_same_key = await call_as("b", "shared-key", "same")
        a_retry = await call_as("a", "shared-key", "same")
        b_retry = await call_as("b", "shared-key", "same")
        a_keyless = await call_as("a", None, "z")
        b_keyless = await call_as("b", None, "z")
        await caller_gave_up(store)  # both answers lost: a's re-send gets a's, never b's
        a_keyless_again = await call_as("a", None, "z")
    assert opened == ["same", "same", "z", "z"]
    assert body(a_first)["content"][0]["text"] == "account #1 for same"
    assert body(b_same_key)["content"][0]["text"] == "account #2 for same"
    assert marker(b_same_key)["status"] == "executed"
    assert answer(a_retry) == answer(a_first) and answer(b_retry) == answer(b_same_key)
    # Derived keys are bound to the principal: on stateless HTTP the token is the caller.
    assert marker(b_keyless)["status"] == "executed"
    assert marker(a_keyless)["key"] != marker(b_keyless)["key"]
    assert answer(a_keyless_again) == answer(a_keyless)


PIXEL = base64.b64encode(b"\x89PNG\r\n\x1a\n-not-really-a-png").decode()


def rich_server(store: KeyStore | None, runs: list[int]) -> FastMCP[Any]:
    """An image, an embedded resource and structured content, with the author's own `_meta`."""
    server: FastMCP[Any] = FastMCP("gallery")
    if store is not None:
        server.add_middleware(IdempotencyMiddleware(store))

    @server.tool
    async def render(title: str) -> ToolResult:
        runs.append(1)
        return ToolResult(
            content=[
                TextContent(type="text", text=f"rendered {title}"),
                ImageContent(type="image", data=PIXEL, mime_type="image/png"),
                EmbeddedResource(
                    type="resource",
                    resource=TextResourceContents(
                        uri="file:///report.txt", mime_type="text/plain", text="ünïcode ✓"
                    ),
                ),
            ],
            structured_content={"title": title, "pages": [1, 2, 3], "ratio": 0.25},
            meta={"example.com/renderer": {"version": 3}},
        )

    return server


def author_meta(result: CallToolResult) -> dict[str, Any]:
    return {k: v for k, v in (result.meta or {}).items() if k != wire.IDEMPOTENCY_META}


def wire_json(result: CallToolResult) -> str:
    """The result as serialized for the wire, with the replay marker's `status` left out."""
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    dumped["_meta"][wire.IDEMPOTENCY_META].pop("status")
    return CallToolResult.model_validate(dumped).model_dump_json(by_alias=True, exclude_none=True)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_rich_results_replay_byte_identically(transport: str) -> None:
    runs: list[int] = []
    args = {"title": "Q3"}
    guarded = rich_server(MemoryKeyStore(), runs)
    async with serving(guarded, transport) as connect, connect() as client:
        first = await client.call_tool_mcp("render", args, meta=meta("pic"))
        replay = await client.call_tool_mcp("render", args, meta=meta("pic"))
    async with serving(rich_server(None, []), transport) as connect, connect() as client:
        reference = await client.call_tool_mcp("render", args)
    assert runs == [1]
    assert marker(replay)["status"] == "replayed"
    assert wire_json(replay) == wire_json(first)
    # What FastMCP itself sends for this tool, unguarded: the same body and the same `_meta`.
    assert body(first) == body(reference)
    assert author_meta(first) == author_meta(replay) == author_meta(reference)
    assert [block["type"] for block in body(replay)["content"]] == ["text", "image", "resource"]


@pytest.mark.parametrize(
    ("transport", "mode", "keys", "expected"),
    [
        ("memory", "auto", "derived", (True, "derived")),
        ("http", "legacy", "derived", (True, "derived")),
        # Stateless HTTP without authentication: no caller to bind a derived key to.
        ("http", "auto", "derived", (None, "optional")),
        ("http", "auto", "required", (True, "required")),
        ("memory", "auto", "optional", (None, "optional")),
    ],
)
async def test_the_listing_promises_what_the_caller_gets(
    transport: str, mode: str, keys: str, expected: tuple[bool | None, str]
) -> None:
    effects = Effects()
    store = MemoryKeyStore()
    guarded = charge_server(store, effects, gated=False, keys=keys)
    resent: CallToolResult | None = None
    async with serving(guarded, transport) as connect, connect(mode=mode) as client:
        (tool,) = await client.list_tools()
        if keys != "required":
            await client.call_tool_mcp("charge", ARGS)
            await caller_gave_up(store)  # its answer lost: the next identical call re-sends it
            resent = await client.call_tool_mcp("charge", ARGS)
    hint, entry = promise(tool)
    assert (hint, entry["keys"]) == expected
    assert entry["retentionSeconds"] == 86400
    # The input schema is the function's own: the key travels in `_meta`, never in arguments.
    assert tool.input_schema["properties"] == {
        "order": {"type": "string"},
        "cents": {"type": "integer"},
    }
    assert sorted(tool.input_schema["required"]) == ["cents", "order"]
    # What the listing promised is what a keyless re-send gets.
    if resent is not None:
        replayed = (resent.meta or {}).get(wire.IDEMPOTENCY_META, {}).get("status") == "replayed"
        assert replayed == (hint is True)
        assert effects.count == (1 if hint else 2)
