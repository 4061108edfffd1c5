"""Which tool the middleware guards: the one FastMCP will run, found as `FastMCP.call_tool` finds
it. An app-callable tool called by its hashed name, a version range, and names FastMCP does not
know (refused with FastMCP's own not-found error, nothing run, even where a middleware further in
would have run something)."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Context, FastMCP, FastMCPApp
from fastmcp.exceptions import NotFoundError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.server.providers.addressing import hashed_backend_name
from fastmcp.tools.base import ToolResult
from fastmcp.utilities.versions import VersionSpec
from fastmcp_kit import charge_server, serving
from mcp import MCPError
from mcp_types import INTERNAL_ERROR, CallToolRequestParams
from server_kit import Effects, body, marker, meta, record_key

from idempotency import KeyStore, MemoryKeyStore, wire
from idempotency.fastmcp import IdempotencyMiddleware

pytestmark = pytest.mark.anyio

ARGS: dict[str, Any] = {"order": "o-1", "cents": 500}
#: The app-callable address of the `Checkout` app's `charge`: `<hash>_charge`.
HASHED = hashed_backend_name("Checkout", "charge")


async def records(store: KeyStore) -> list[Any]:
    return list(await store.list_records())


async def record_keys(store: KeyStore) -> set[str]:
    return {r.key for r in await records(store)}


# -- app-callable tools called by their hashed name ----------------------------------------------


def app_shop(store: KeyStore, effects: Effects, *, namespace: str = "") -> FastMCP[Any]:
    """A guarded server whose `charge` comes from a `FastMCPApp`, callable by the model under
    its listed name and by the app under `HASHED`."""
    server: FastMCP[Any] = FastMCP("shop")
    server.add_middleware(IdempotencyMiddleware(store))
    app = FastMCPApp("Checkout")

    @app.tool(model=True)
    async def charge(order: str, cents: int) -> str:
        return await effects.charge(order, cents, gated=False)

    server.add_provider(app, namespace=namespace)
    return server


async def test_a_hashed_name_call_runs_once_and_its_retry_replays() -> None:
    effects = Effects()
    store = MemoryKeyStore()
    async with serving(app_shop(store, effects), "memory") as connect, connect() as client:
        first = await client.call_tool_mcp(HASHED, ARGS, meta=meta("k"))
        retry = await client.call_tool_mcp(HASHED, ARGS, meta=meta("k"))
    assert effects.count == 1
    assert marker(first)["status"] == "executed" and marker(retry)["status"] == "replayed"
    assert body(retry) == body(first)
    assert len(await records(store)) == 1


@pytest.mark.parametrize("namespace", ["", "pay"], ids=["as-registered", "namespaced"])
async def test_the_hashed_name_and_the_listed_name_share_one_record(namespace: str) -> None:
    """Two addresses of one tool: a retry by either replays what the other ran, under the name
    the server lists the tool by."""
    listed = f"{namespace}_charge" if namespace else "charge"
    effects = Effects()
    store = MemoryKeyStore()
    server = app_shop(store, effects, namespace=namespace)
    async with serving(server, "memory") as connect, connect() as client:
        by_hash = await client.call_tool_mcp(HASHED, ARGS, meta=meta("k"))
        by_name = await client.call_tool_mcp(listed, ARGS, meta=meta("k"))
        name_first = await client.call_tool_mcp(listed, ARGS, meta=meta("k2"))
        hash_after = await client.call_tool_mcp(HASHED, ARGS, meta=meta("k2"))
    assert effects.count == 2
    assert [marker(r)["status"] for r in (by_hash, by_name, name_first, hash_after)] == [
        "executed",
        "replayed",
        "executed",
        "replayed",
    ]
    assert await record_keys(store) == {record_key("shop", listed, k) for k in ("k", "k2")}


async def test_a_hashed_name_shadowed_by_another_tool_keeps_its_own_record() -> None:
    """The server's own `charge` takes the listed name, so it and the app's `charge` are two tools:
    one key runs each once, and neither replays the other's result."""
    own, app_effects = Effects(), Effects()
    store = MemoryKeyStore()
    server = app_shop(store, app_effects)

    @server.tool(name="charge")
    async def own_charge(order: str, cents: int) -> str:
        return await own.charge(order, cents, gated=False)

    async with serving(server, "memory") as connect, connect() as client:
        by_name = await client.call_tool_mcp("charge", ARGS, meta=meta("k"))
        by_hash = await client.call_tool_mcp(HASHED, ARGS, meta=meta("k"))
        hash_retry = await client.call_tool_mcp(HASHED, ARGS, meta=meta("k"))
    assert (own.count, app_effects.count) == (1, 1)
    assert [marker(r)["status"] for r in (by_name, by_hash, hash_retry)] == [
        "executed",
        "executed",
        "replayed",
    ]
    assert await record_keys(store) == {record_key("shop", t, "k") for t in ("charge", HASHED)}


# -- version ranges ------------------------------------------------------------------------------


def versioned_shop(store: KeyStore, runs: list[str]) -> FastMCP[Any]:
    """`charge` in two versions, only 1.x tagged `money` (the guarded tag); `route`, unguarded,
    calls `charge` with a version range within the same request (so under its key)."""
    server: FastMCP[Any] = FastMCP("shop")
    server.add_middleware(IdempotencyMiddleware(store, tags={"money"}))

    @server.tool(name="charge", version="1.0", tags={"money"})
    async def charge_v1(order: str) -> str:
        runs.append("1.0")
        return f"charged {order} (1.0)"

    @server.tool(name="charge", version="2.0")
    async def charge_v2(order: str) -> str:
        runs.append("2.0")
        return f"charged {order} (2.0)"

    @server.tool
    async def route(order: str, gte: str, lt: str, ctx: Context) -> str:
        ran = await ctx.fastmcp.call_tool(
            "charge", {"order": order}, version=VersionSpec(gte=gte, lt=lt)
        )
        status = (ran.meta or {}).get(wire.IDEMPOTENCY_META, {}).get("status", "unguarded")
        return str(status)

    return server


async def test_a_version_range_is_guarded_as_the_version_fastmcp_runs() -> None:
    """The highest version (2.0) is not guarded, 1.0 is: a range selecting 1.0 runs it once and
    replays its retry; a range selecting 2.0 runs it each time, as chosen."""
    runs: list[str] = []
    store = MemoryKeyStore()
    async with serving(versioned_shop(store, runs), "memory") as connect, connect() as client:

        async def route(gte: str, lt: str, key: str) -> str:
            args = {"order": "o", "gte": gte, "lt": lt}
            routed = await client.call_tool_mcp("route", args, meta=meta(key))
            return str(body(routed)["content"][0]["text"])

        old = [await route("1", "2", "k") for _ in "12"]
        new = [await route("2", "3", "n") for _ in "12"]
    assert old == ["executed", "replayed"]
    assert new == ["unguarded", "unguarded"]
    assert runs == ["1.0", "2.0", "2.0"]
    # The version is part of the tool's identity (issue #20): 1.0's record is its own.
    assert await record_keys(store) == {record_key("shop", "charge@1.0", "k")}


async def test_a_version_that_cannot_be_read_back_is_refused() -> None:
    """A middleware outside the guard rewrote the version in the message: the guard cannot tell
    which version FastMCP will run, so it refuses (-32603) and nothing runs."""
    runs: list[str] = []
    server = versioned_shop(MemoryKeyStore(), runs)

    class Scribble(Middleware):
        async def on_call_tool(
            self,
            context: MiddlewareContext[CallToolRequestParams],
            call_next: CallNext[CallToolRequestParams, ToolResult],
        ) -> ToolResult:
            message = context.message.model_copy(update={"meta": {"fastmcp": {"version": 2}}})
            return await call_next(context.copy(message=message))

    server.middleware.insert(0, Scribble())
    with pytest.raises(MCPError) as refused:
        await server.call_tool("charge", {"order": "o"}, version=VersionSpec(gte="1", lt="2"))
    assert refused.value.error.code == INTERNAL_ERROR and "version" in refused.value.error.message
    assert runs == []


# -- names FastMCP does not know -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["refund", "0123456789ab_charge"], ids=["plain", "hash-shaped"])
async def test_an_unknown_name_gets_fastmcps_own_not_found_and_nothing_runs(name: str) -> None:
    effects = Effects()
    store = MemoryKeyStore()
    server = charge_server(store, effects, gated=False)
    plain = charge_server(None, Effects(), gated=False)
    async with serving(server, "memory") as connect, connect() as client:
        unknown = await client.call_tool_mcp(name, ARGS, meta=meta("u"))
    async with serving(plain, "memory") as connect, connect() as client:
        reference = await client.call_tool_mcp(name, ARGS, meta=meta("u"))
    assert unknown.is_error is True and body(unknown) == body(reference)
    assert body(unknown)["content"][0]["text"] == f"Unknown tool: {name!r}"
    with pytest.raises(NotFoundError, match="Unknown tool"):
        await server.call_tool(name, ARGS)
    assert effects.count == 0 and await records(store) == []


async def test_a_name_only_a_middleware_further_in_resolves_is_refused_not_run_unguarded() -> None:
    """Not found here does not prove nothing will run: a middleware inside the guard that
    renames the call would run `charge` unguarded. The guard refuses instead."""
    effects = Effects()
    store = MemoryKeyStore()
    server = charge_server(store, effects, gated=False)

    class Rename(Middleware):
        async def on_call_tool(
            self,
            context: MiddlewareContext[CallToolRequestParams],
            call_next: CallNext[CallToolRequestParams, ToolResult],
        ) -> ToolResult:
            message = context.message.model_copy(update={"name": "charge"})
            return await call_next(context.copy(message=message))

    server.add_middleware(Rename())
    async with serving(server, "memory") as connect, connect() as client:
        refused = [await client.call_tool_mcp("pay", ARGS, meta=meta("r")) for _ in "12"]
    assert effects.count == 0 and await records(store) == []
    for result in refused:
        assert result.is_error is True
        assert body(result)["content"][0]["text"] == "Unknown tool: 'pay'"
