"""What clients see before they call: the listed definitions of guarded tools (schemas exactly as
written, `idempotentHint`, our `_meta`), for the decorator, `install` and the low-level server;
and mistakes in wiring or options refused with a clear error."""

from __future__ import annotations

import json
from typing import Annotated, Any

import pytest
from mcp.client import Client
from mcp.server import Server
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
    ToolAnnotations,
)
from pydantic import BaseModel, Field
from server_kit import answer, body, marker, meta

from idempotency import MemoryKeyStore, idempotent, idempotent_call_tool, install, wire

pytestmark = pytest.mark.anyio


class Address(BaseModel):
    street: str
    zip: Annotated[str, Field(pattern=r"^\d{5}$")]


class Receipt(BaseModel):
    id: str
    cents: int


def fresh_functions() -> list[Any]:
    """New function objects per test: a function registered unguarded cannot be wrapped later."""

    async def plain_order(item: str, qty: int = 1, gift: bool = False) -> Receipt:
        """Place an order."""
        return Receipt(id=f"{item}x{qty}", cents=qty * 100)

    def sync_ship(address: Address, notes: list[str] | None = None) -> str:
        return f"ship to {address.street}"

    async def with_context(query: str, ctx: Context) -> dict[str, int]:
        return {"len": len(query)}

    async def keyword_only(*, a: int, b: Annotated[str, Field(description="b text")] = "x") -> str:
        return f"{a}{b}"

    return [plain_order, sync_ship, with_context, keyword_only]


async def plain_order(item: str, qty: int = 1, gift: bool = False) -> Receipt:
    """Place an order."""
    return Receipt(id=f"{item}x{qty}", cents=qty * 100)


def listing_json(tools: list[Tool]) -> dict[str, tuple[str, str]]:
    return {t.name: (json.dumps(t.input_schema), json.dumps(t.output_schema)) for t in tools}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_schemas_are_byte_identical_to_the_unwrapped_tools(mode: str) -> None:
    guarded, plain = MCPServer("s"), MCPServer("s")
    store = MemoryKeyStore()
    for fn in fresh_functions():
        # Wrapped first: a function already registered as a tool is refused (see below).
        guarded.tool()(idempotent(store)(fn))
        plain.tool()(fn)
    async with Client(guarded, mode=mode) as a, Client(plain, mode=mode) as b:
        ours = (await a.list_tools()).tools
        theirs = (await b.list_tools()).tools
    assert listing_json(ours) == listing_json(theirs)
    assert [t.description for t in ours] == [t.description for t in theirs]
    for tool in ours:
        assert "mcp_once_context" not in json.dumps(tool.input_schema)


async def test_guarded_tools_still_validate_and_convert_like_the_sdk() -> None:
    server = MCPServer("s")
    server.tool()(idempotent(MemoryKeyStore())(plain_order))
    async with Client(server) as client:
        ok = await client.call_tool("plain_order", {"item": "pen", "qty": 3}, meta=meta("v1"))
        bad = await client.call_tool("plain_order", {"item": "pen", "qty": "many"}, meta=meta("v2"))
        again = await client.call_tool("plain_order", {"item": "pen", "qty": 2}, meta=meta("v2"))
    assert ok.structured_content == {"id": "penx3", "cents": 300}
    # Invalid arguments are refused by the SDK before the guard: nothing runs, nothing is kept.
    assert bad.is_error is True and wire.IDEMPOTENCY_META not in (bad.meta or {})
    assert marker(again)["status"] == "executed"


async def test_annotations_and_meta_are_merged_into_what_the_author_wrote() -> None:
    server = MCPServer("s")
    store = MemoryKeyStore()

    @server.tool()
    @idempotent(store)
    async def bare(x: int) -> int:
        return x

    @server.tool(
        title="Refund",
        annotations=ToolAnnotations(
            title="Refund it", destructive_hint=True, open_world_hint=False
        ),
        meta={"example.com/owner": "billing"},
    )
    @idempotent(store, keys="required", retention=3600)
    async def refund(x: int) -> int:
        return x

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    @idempotent(store, keys="optional")
    async def lookup(x: int) -> int:
        return x

    # An in-memory connection is a caller the server can tell apart; the SDK's modern in-process
    # direct dispatch is not (no connection object outlives a request there).
    async with Client(server, mode="legacy") as client:
        tools = {t.name: dumped(t) for t in (await client.list_tools()).tools}
    async with Client(server) as anonymous:
        anonymous_tools = {t.name: dumped(t) for t in (await anonymous.list_tools()).tools}

    assert tools["bare"]["annotations"] == {"idempotentHint": True}
    assert tools["bare"]["_meta"] == {
        wire.IDEMPOTENCY_META: {"keys": "derived", "retentionSeconds": 86400}
    }
    # No caller identity: keyless calls are not merged, so the author's annotation stands.
    assert "annotations" not in anonymous_tools["bare"]
    assert anonymous_tools["bare"]["_meta"] == {
        wire.IDEMPOTENCY_META: {"keys": "optional", "retentionSeconds": 86400}
    }
    for listing in (tools, anonymous_tools):
        assert listing["refund"]["annotations"] == {
            "title": "Refund it",
            "destructiveHint": True,
            "idempotentHint": True,
            "openWorldHint": False,
        }
        assert listing["refund"]["_meta"] == {
            "example.com/owner": "billing",
            wire.IDEMPOTENCY_META: {"keys": "required", "retentionSeconds": 3600},
        }
        assert listing["refund"]["title"] == "Refund"
        assert listing["lookup"]["annotations"] == {"readOnlyHint": True}
        assert listing["lookup"]["_meta"][wire.IDEMPOTENCY_META]["keys"] == "optional"


def dumped(tool: Tool) -> dict[str, Any]:
    return tool.model_dump(by_alias=True, mode="json", exclude_none=True)


def test_decorator_above_server_tool_is_refused() -> None:
    server = MCPServer("s")
    with pytest.raises(TypeError, match=r"\*under\* @server.tool"):

        @idempotent(MemoryKeyStore())
        @server.tool()
        async def wrong_order(x: int) -> int:
            return x


def test_wrapping_twice_is_refused() -> None:
    store = MemoryKeyStore()
    with pytest.raises(TypeError, match="already guarded"):

        @idempotent(store)
        @idempotent(store)
        async def twice(x: int) -> int:
            return x


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"keys": "sometimes"}, ValueError, "keys must be one of"),
        ({"lease": 0}, ValueError, "lease must be a positive"),
        ({"retention": float("inf")}, ValueError, "finite"),
        ({"wait": -1}, ValueError, "wait must be"),
        ({"max_run_time": "soon"}, TypeError, "max_run_time must be a number"),
        ({"effect_free": KeyboardInterrupt}, TypeError, "Exception subclasses"),
        ({"effect_free": "ValueError"}, TypeError, "Exception subclasses"),
        ({"max_result_bytes": 0}, ValueError, "max_result_bytes"),
        ({"takeover": "yes"}, TypeError, "takeover must be"),
        ({"scope": "tenant"}, TypeError, "scope must be a callable"),
        ({"retenion": 5}, TypeError, "unknown idempotency option"),
    ],
)
def test_bad_options_are_refused_at_decoration_time(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        idempotent(MemoryKeyStore(), **options)


async def test_install_guards_every_tool_now_and_later() -> None:
    server = MCPServer("shop")
    store = MemoryKeyStore()
    runs: list[str] = []

    @server.tool()
    async def before(x: int) -> str:
        runs.append("before")
        return f"before {x}"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True, title="Own"))
    async def declared(x: int, ctx: Context) -> str:
        runs.append("declared")
        return f"declared {x}"

    @server.tool()
    @idempotent(store, keys="required")
    async def own_policy(x: int) -> str:
        runs.append("own_policy")
        return f"own {x}"

    @server.tool()
    async def excluded(x: int) -> str:
        runs.append("excluded")
        return f"excluded {x}"

    plain_schemas = {t.name: t.input_schema for t in await server.list_tools()}
    install(server, store, exclude={"excluded"}, keys="optional")

    @server.tool()
    def after(x: int) -> str:
        runs.append("after")
        return f"after {x}"

    with pytest.raises(RuntimeError, match="already installed"):
        install(server, store)

    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        for name in ("before", "declared", "own_policy", "excluded", "after"):
            for _ in range(2):
                await client.call_tool(name, {"x": 1}, meta=meta(f"k-{name}"))
        keyless = [await client.call_tool("before", {"x": 2}) for _ in range(2)]
    assert runs == [
        "before",
        "declared",
        "own_policy",
        "excluded",
        "excluded",
        "after",
        "before",
        "before",
    ]
    for name in ("before", "declared", "own_policy", "excluded"):
        assert tools[name].input_schema == plain_schemas[name]
    policy = {n: (t.meta or {}).get(wire.IDEMPOTENCY_META) for n, t in tools.items()}
    assert policy["before"] == {"keys": "optional", "retentionSeconds": 86400}
    assert policy["after"] == policy["before"]
    assert policy["own_policy"] == {"keys": "required", "retentionSeconds": 86400}
    assert policy["excluded"] is None
    assert tools["declared"].annotations is not None
    assert tools["declared"].annotations.title == "Own"
    assert tools["excluded"].annotations is None
    assert all(wire.IDEMPOTENCY_META not in (r.meta or {}) for r in keyless)


async def test_low_level_server_handler_is_guarded_and_advertised() -> None:
    runs: list[str] = []

    async def list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
        return ListToolsResult(
            tools=[
                Tool(name="bump", input_schema=schema, annotations=ToolAnnotations(title="Bump")),
                Tool(name="peek", input_schema=schema),
            ]
        )

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        runs.append(params.name)
        n = (params.arguments or {}).get("n")
        if n == 13:
            raise RuntimeError("unlucky secret")
        return CallToolResult(content=[TextContent(type="text", text=f"{params.name} {n}")])

    guarded = idempotent_call_tool(MemoryKeyStore(), call_tool, tools={"bump"}, server_name="lo")
    server = Server("lo", on_list_tools=guarded.advertise(list_tools), on_call_tool=guarded)
    async with Client(server) as anonymous:
        anonymous_tools = {t.name: t for t in (await anonymous.list_tools()).tools}
    async with Client(server, mode="legacy") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        first = await client.call_tool("bump", {"n": 1}, meta=meta("a"))
        retry = await client.call_tool("bump", {"n": 1}, meta=meta("a"))
        failed = await client.call_tool("bump", {"n": 13}, meta=meta("b"))
        failed_again = await client.call_tool("bump", {"n": 13}, meta=meta("b"))
        peeks = [await client.call_tool("peek", {"n": 1}, meta=meta("a")) for _ in "12"]
    assert runs == ["bump", "bump", "peek", "peek"]
    assert tools["bump"].annotations == ToolAnnotations(title="Bump", idempotent_hint=True)
    assert (tools["bump"].meta or {})[wire.IDEMPOTENCY_META]["keys"] == "derived"
    assert tools["peek"].annotations is None and tools["peek"].meta is None
    assert anonymous_tools["bump"].annotations == ToolAnnotations(title="Bump")
    assert (anonymous_tools["bump"].meta or {})[wire.IDEMPOTENCY_META]["keys"] == "optional"
    assert marker(retry)["status"] == "replayed" and answer(retry) == answer(first)
    assert failed.is_error is True
    assert body(failed)["content"] == [{"type": "text", "text": "Error executing tool bump"}]
    assert answer(failed_again) == answer(failed)
    assert all(wire.IDEMPOTENCY_META not in (p.meta or {}) for p in peeks)
