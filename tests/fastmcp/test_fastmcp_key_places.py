"""Issue #24 on FastMCP: `IdempotencyMiddleware(key_argument=..., key_header=...)`, through real
FastMCP clients in memory and over streamable HTTP. The same rules as on `MCPServer`
(`tests/server/test_key_places.py`); here what FastMCP adds: it refuses arguments a function
does not take, so the middleware hands the body the call without an undeclared key argument.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client, FastMCP
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp_kit import TRANSPORTS, charge_server, promise, serving
from mcp import MCPError
from mcp_types import TextContent
from server_kit import Effects, marker, meta, serve_http

from idempotency import MemoryKeyStore, wire
from idempotency._guard.keyplaces import KEY_ARGUMENT_DESCRIPTION
from idempotency.fastmcp import IdempotencyMiddleware

pytestmark = pytest.mark.anyio

ARGS: dict[str, Any] = {"order": "o", "cents": 1}


def with_key(path: str, key: object) -> dict[str, Any]:
    out: dict[str, Any] = dict(ARGS)
    node = out
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = key
    return out


@pytest.mark.parametrize("path", ["idempotency_key", "meta.idempotency-key"])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_argument_key_replays_and_a_new_key_runs_again(transport: str, path: str) -> None:
    effects = Effects()
    server = charge_server(
        MemoryKeyStore(), effects, gated=False, keys="optional", key_argument=path
    )
    async with serving(server, transport) as connect, connect() as client:
        first = await client.call_tool_mcp("charge", with_key(path, "k-1"))
        again = await client.call_tool_mcp("charge", with_key(path, "k-1"))
        other = await client.call_tool_mcp("charge", with_key(path, "k-2"))
    assert not first.is_error, first
    assert effects.count == 2
    assert marker(first)["status"] == "executed" and marker(again)["status"] == "replayed"
    assert marker(again)["key"] == "k-1"
    assert marker(other)["status"] == "executed"


async def test_the_body_gets_the_key_argument_only_when_it_declares_it() -> None:
    mcp: FastMCP[Any] = FastMCP("shop")
    mcp.add_middleware(IdempotencyMiddleware(MemoryKeyStore(), key_argument="idempotency_key"))
    seen: list[dict[str, Any]] = []

    @mcp.tool
    def plain(order: str) -> str:
        seen.append({"order": order})
        return "ok"

    @mcp.tool
    def declared(order: str, idempotency_key: str | None = None) -> str:
        seen.append({"order": order, "idempotency_key": idempotency_key})
        return "ok"

    async with Client(mcp) as client:
        await client.call_tool_mcp("plain", {"order": "o", "idempotency_key": "k1"})
        await client.call_tool_mcp("declared", {"order": "o", "idempotency_key": "k2"})
        tools = {t.name: t for t in await client.list_tools()}
    assert seen == [{"order": "o"}, {"order": "o", "idempotency_key": "k2"}]
    plain_key = tools["plain"].input_schema["properties"]["idempotency_key"]
    assert plain_key["description"] == KEY_ARGUMENT_DESCRIPTION
    assert tools["declared"].input_schema["properties"]["idempotency_key"]["description"] == (
        KEY_ARGUMENT_DESCRIPTION
    )


@pytest.mark.parametrize("key", [42, None, "", "k" * 256, "tab\tkey", "clé"], ids=str)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_bad_argument_key_is_invalid_params_and_nothing_happens(
    transport: str, key: object
) -> None:
    effects = Effects()
    store = MemoryKeyStore()
    server = charge_server(store, effects, gated=False, key_argument="idempotency_key")
    async with serving(server, transport) as connect, connect() as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool_mcp("charge", with_key("idempotency_key", key))
    assert caught.value.code == wire.INVALID_PARAMS
    assert "argument 'idempotency_key'" in caught.value.message
    assert effects.count == 0
    assert await store.list_records() == []


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_meta_and_argument_keys_that_disagree_are_refused(transport: str) -> None:
    effects = Effects()
    store = MemoryKeyStore()
    server = charge_server(store, effects, gated=False, key_argument="idempotency_key")
    async with serving(server, transport) as connect, connect() as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool_mcp("charge", with_key("idempotency_key", "a"), meta=meta("b"))
        await client.call_tool_mcp("charge", with_key("idempotency_key", "a"), meta=meta("a"))
        agreed = await client.call_tool_mcp("charge", with_key("idempotency_key", "a"))
    assert caught.value.code == wire.INVALID_PARAMS
    assert wire.KEY_META in caught.value.message
    assert "argument 'idempotency_key'" in caught.value.message
    assert effects.count == 1 and marker(agreed)["status"] == "replayed"


async def test_header_key_deduplicates_a_keyless_body_and_bad_headers_are_refused() -> None:
    effects = Effects()
    store = MemoryKeyStore()
    server = charge_server(
        store, effects, gated=False, keys="optional", key_header="Idempotency-Key"
    )

    def client(base: str, value: str) -> Client[Any]:
        return Client(StreamableHttpTransport(f"{base}/mcp", headers={"Idempotency-Key": value}))

    async with serve_http(server.http_app()) as base:
        async with client(base, "h-1") as one:
            first = await one.call_tool_mcp("charge", ARGS)
        async with client(base, "h-1") as two:
            again = await two.call_tool_mcp("charge", ARGS)
        for bad in ("", "k" * 256, "a\tb"):
            async with client(base, bad) as three:
                with pytest.raises(MCPError) as caught:
                    await three.call_tool_mcp("charge", ARGS)
            assert caught.value.code == wire.INVALID_PARAMS
            assert "HTTP header 'Idempotency-Key'" in caught.value.message
    assert marker(first)["status"] == "executed" and marker(again)["status"] == "replayed"
    assert effects.count == 1
    assert len(await store.list_records()) == 1


async def test_the_header_is_ignored_unless_the_middleware_opts_in() -> None:
    effects = Effects()
    server = charge_server(MemoryKeyStore(), effects, gated=False, keys="optional")
    async with serve_http(server.http_app()) as base:
        for _ in range(2):
            transport = StreamableHttpTransport(f"{base}/mcp", headers={"Idempotency-Key": "h-1"})
            async with Client(transport) as client:
                await client.call_tool_mcp("charge", ARGS)
    assert effects.count == 2


@pytest.mark.parametrize("keys", ["optional", "required", "derived"])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_argument_keyed_tool_is_listed_retry_safe_with_its_key_place(
    transport: str, keys: str
) -> None:
    """To every caller, whatever `keys` says, also over HTTP where this server has no caller
    identity (a keyless tool is listed without the hint there: see `UNCHANGED_LISTING`)."""
    server = charge_server(
        MemoryKeyStore(), Effects(), keys=keys, key_argument="meta.idempotency-key"
    )
    async with serving(server, transport) as connect, connect() as client:
        (tool,) = await client.list_tools()
    hint, entry = promise(tool)
    assert hint is True
    assert entry[wire.DEFINITION_KEY_ARGUMENT] == "meta.idempotency-key"
    nested = tool.input_schema["properties"]["meta"]
    assert nested["properties"]["idempotency-key"]["description"] == KEY_ARGUMENT_DESCRIPTION
    required = keys == "required"
    assert ("meta" in tool.input_schema["required"]) is required
    assert (nested.get("required") == ["idempotency-key"]) is required


def _listing_before_issue_24(keys: str, **extra: Any) -> dict[str, Any]:
    """`charge` as the middleware listed it before issue 24 (captured from main's code)."""
    return {
        "_meta": {
            "fastmcp": {"tags": []},
            "io.github.mcp-once/idempotency": {"keys": keys, "retentionSeconds": 86400},
        },
        **extra,
        "inputSchema": {
            "additionalProperties": False,
            "properties": {"cents": {"type": "integer"}, "order": {"type": "string"}},
            "required": ["order", "cents"],
            "type": "object",
        },
        "name": "charge",
        "outputSchema": {
            "properties": {"result": {"type": "string"}},
            "required": ["result"],
            "type": "object",
            "x-fastmcp-wrap-result": True,
        },
        "title": "Charge",
    }


#: Per transport: HTTP callers have no identity here (keys "optional"), in-memory ones do.
UNCHANGED_LISTING: dict[str, Any] = {
    "http": _listing_before_issue_24("optional"),
    "memory": _listing_before_issue_24("derived", annotations={"idempotentHint": True}),
}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_tool_without_these_options_is_listed_as_before(transport: str) -> None:
    server = charge_server(MemoryKeyStore(), Effects())
    async with serving(server, transport) as connect, connect() as client:
        (tool,) = await client.list_tools()
    dumped = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert dumped == UNCHANGED_LISTING[transport]


# --- what the fingerprint covers (`fingerprint=`) -------------------------------------------


def volatile_server(effects: Effects, option: Any) -> FastMCP[Any]:
    """`charge` with two volatile fields a client may change between sends of one call. FastMCP
    refuses arguments a function does not take, so the function declares them."""
    mcp: FastMCP[Any] = FastMCP("shop")
    mcp.add_middleware(
        IdempotencyMiddleware(MemoryKeyStore(), key_argument="idempotency_key", fingerprint=option)
    )

    @mcp.tool
    async def charge(
        order: str, cents: int, sent_at: str | None = None, trace: dict[str, str] | None = None
    ) -> str:
        return await effects.charge(order, cents, gated=False)

    return mcp


@pytest.mark.parametrize(
    "option",
    [
        {"exclude": ["sent_at", "trace.id"]},
        {"include": ["order", "cents"]},
        lambda arguments: [arguments["order"], arguments["cents"]],
        None,
    ],
    ids=["exclude", "include", "function", "every-argument"],
)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_retry_that_changed_only_an_uncovered_field_replays(
    transport: str, option: Any
) -> None:
    """A retry that changed only what the fingerprint leaves out replays (1 effect); one that
    changed a covered field is -32011. Without `fingerprint=` (every argument counts) the
    first retry is -32011 too: the option is what makes it replay."""
    effects = Effects()
    sent = with_key("idempotency_key", "k")
    async with serving(volatile_server(effects, option), transport) as connect, connect() as c:
        first = await c.call_tool_mcp("charge", {**sent, "sent_at": "10:00", "trace": {"id": "1"}})
        volatile = {**sent, "sent_at": "10:01", "trace": {"id": "2"}}
        if option is None:
            with pytest.raises(MCPError) as changed:
                await c.call_tool_mcp("charge", volatile)
            assert changed.value.code == wire.KEY_REUSED
        else:
            retry = await c.call_tool_mcp("charge", volatile)
            assert marker(retry)["status"] == "replayed" and text_of(retry) == text_of(first)
        with pytest.raises(MCPError) as reused:
            await c.call_tool_mcp("charge", {**sent, "cents": 2, "sent_at": "10:02"})
    assert marker(first)["status"] == "executed"
    assert reused.value.code == wire.KEY_REUSED
    assert effects.count == 1


def text_of(result: Any) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def test_retrying_client_puts_its_key_in_the_argument_on_every_attempt() -> None:
    """`orchestrator.fastmcp.RetryingClient` (through `RetryingSession`) reads the listing's
    `keyArgument` and sends its key there as well as in `_meta`, over a link that loses the first
    answer: one effect, the retry replayed, the same key in the argument of both attempts."""
    from fastmcp.server.middleware import Middleware, MiddlewareContext

    from orchestrator import RetryPolicy
    from orchestrator.chaos import Chaos, Fault, FaultPlan
    from orchestrator.fastmcp import RetryingClient, SDKStreamTransport

    arrived: list[dict[str, Any]] = []
    ran: list[str | None] = []

    class Arrivals(Middleware):
        async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
            arrived.append(dict(context.message.arguments or {}))
            return await call_next(context)

    mcp: FastMCP[Any] = FastMCP("shop")
    mcp.add_middleware(Arrivals())
    mcp.add_middleware(IdempotencyMiddleware(MemoryKeyStore(), key_argument="idempotency_key"))

    @mcp.tool
    def charge(order: str, idempotency_key: str | None = None) -> str:
        ran.append(idempotency_key)
        return f"charged {order}"

    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK, 2: None}, tools={"charge"}), seed=7)
    policy = RetryPolicy(max_attempts=3, attempt_timeout=2.0, deadline=30.0)
    async with serve_http(mcp.http_app()) as base:
        url = f"{base}/mcp"
        client = RetryingClient(SDKStreamTransport(lambda: chaos.wrap(url)), policy=policy)
        async with client:
            result = await client.call_tool_mcp("charge", {"order": "o"})
        await chaos.settled()
    assert [f.kind for f in chaos.faults] == [Fault.LOST_ACK]
    assert marker(result)["status"] == "replayed"
    assert len(ran) == 1 and ran[0] is not None and wire.key_problem(ran[0]) is None
    assert [a.get("idempotency_key") for a in arrived] == [ran[0], ran[0]]
