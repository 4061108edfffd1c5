"""Issue #20 on the mcp SDK's entry points: wherever the guard protects nothing, a call through
`@idempotent`, `install()` or the low-level handler is the SDK's own call.

The table: every path on which the guard protects nothing (keys="optional", no caller to bind a
derived key to, fail-open with the store down, a tool not chosen, a read-only tool without a
key, a tool opted out of derived keys), on each transport that path exists on, through each kind
of call, against the same server without the guard; the whole answer (or JSON-RPC error, or
in process the exception's type and text) is compared, and so are the SDK's log lines.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
from log_lines import logged
from mcp import MCPError
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
    ToolAnnotations,
)
from otel_spans import Shape, recorder, shapes
from server_kit import SOON, DownStore, meta, serve_http

from idempotency import KeyStore, MemoryKeyStore, idempotent, idempotent_call_tool, install, wire

pytestmark = pytest.mark.anyio

ARGS: dict[str, Any] = {"order": "o", "cents": 1}

#: The kinds of call: (tool, arguments).
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "ok": ("charge", ARGS),
    "invalid-arguments": ("charge", {"order": "o", "cents": "many"}),
    "body-raises": ("fail", {"kind": "value"}),
    "tool-error": ("fail", {"kind": "tool-error"}),
    "mcp-error": ("fail", {"kind": "mcp-error"}),
    "read-only": ("look", {"order": "o"}),
    "unknown-tool": ("nope", {}),
}
TOOLS = {name for name, _ in CALLS.values()}


class Ledger:
    def __init__(self) -> None:
        self.count = 0

    def charge(self, order: str, cents: int) -> str:
        self.count += 1
        return f"charged {cents} for {order} (execution {self.count})"


def fail_with(kind: str) -> str:
    if kind == "tool-error":
        raise ToolError("card declined")
    if kind == "mcp-error":
        raise MCPError(INVALID_PARAMS, "no such card")
    raise ValueError("the bank said no")


def mcpserver(ledger: Ledger, guard: Callable[[Any], Any] | None) -> MCPServer:
    """`charge`, `fail`, `look` (read-only) on an `MCPServer`; `guard` wraps each function
    (`@idempotent`), or None."""
    server = MCPServer("shop")
    wrap = guard or (lambda fn: fn)

    @server.tool()
    @wrap
    async def charge(order: str, cents: int) -> str:
        return ledger.charge(order, cents)

    @server.tool()
    @wrap
    async def fail(kind: str) -> str:
        return fail_with(kind)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    @wrap
    async def look(order: str) -> str:
        return f"looked at {order}"

    return server


def lowlevel(ledger: Ledger, guarded: Callable[[Any], Any] | None) -> Server[Any]:
    """The same tools behind one low-level handler (which validates nothing itself)."""

    async def list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        schema = {"type": "object"}
        return ListToolsResult(tools=[Tool(name=n, input_schema=schema) for n in sorted(TOOLS)])

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        args = params.arguments or {}
        if params.name == "charge":
            if not isinstance(args.get("cents"), int):
                raise MCPError(INVALID_PARAMS, "cents must be an integer")
            text = ledger.charge(str(args["order"]), args["cents"])
        elif params.name == "fail":
            text = fail_with(str(args["kind"]))
        elif params.name == "look":
            text = f"looked at {args['order']}"
        else:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {params.name}")
        return CallToolResult(content=[TextContent(type="text", text=text)])

    handler = call_tool if guarded is None else guarded(call_tool)
    return Server("shop", on_list_tools=list_tools, on_call_tool=handler)


def build(integration: str, path: str, ledger: Ledger, guarded: bool) -> Any:
    """The server under test: `integration` guarded so that `path` protects nothing."""
    store: KeyStore = DownStore() if path == "fail-open" else MemoryKeyStore()
    options: dict[str, Any] = {
        "keys-optional": {"keys": "optional"},
        "no-caller": {},
        "fail-open": {"fail_open": True},
        "underived": {"derived": False},
        "not-chosen": {},
    }[path]
    if integration == "lowlevel":
        if path == "not-chosen":
            options["tools"] = {"other"}
        if path == "underived":
            options = {"underived": TOOLS}
        return lowlevel(
            ledger,
            (lambda h: idempotent_call_tool(store, h, server_name="shop", **options))
            if guarded
            else None,
        )
    if integration == "decorator":
        return mcpserver(ledger, idempotent(store, **options) if guarded else None)
    server = mcpserver(ledger, None)
    if guarded:
        if path == "not-chosen":
            options["exclude"] = TOOLS
        install(server, store, **options)
    return server


Call = Callable[[str, dict[str, Any], Any], Awaitable[Any]]


@asynccontextmanager
async def caller(server: Any, transport: str) -> AsyncIterator[Call]:
    """One way of calling `server`; the call returns its whole outcome."""
    if transport == "inproc":

        async def direct(name: str, args: dict[str, Any], key: Any) -> Any:
            try:
                result = await server.call_tool(name, args)
            except Exception as exc:
                cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else None
                return ("raised", type(exc).__qualname__, str(exc), cause)
            return ("result", result.model_dump(by_alias=True, mode="json", exclude_none=True))

        yield direct
        return

    async def over(client: Client) -> AsyncIterator[Call]:
        async def call(name: str, args: dict[str, Any], key: Any) -> Any:
            try:
                result = await client.call_tool(name, args, meta=key)
            except MCPError as exc:
                return ("error", exc.error.code, exc.error.message, exc.error.data)
            return ("result", result.model_dump(by_alias=True, mode="json", exclude_none=True))

        yield call

    if transport in ("memory", "direct"):
        # "memory": one identified connection (legacy handshake); "direct": no caller identity.
        mode = "legacy" if transport == "memory" else "auto"
        async with Client(server, mode=mode) as client:
            async for call in over(client):
                yield call
        return
    app = server.streamable_http_app(stateless_http=transport == "http-stateless")
    async with (
        serve_http(app) as base,
        httpx2.AsyncClient() as http,
        Client(streamable_http_client(f"{base}/mcp", http_client=http), mode="legacy") as client,
    ):
        async for call in over(client):
            yield call


#: (path, transports): the transports on which that path protects nothing.
TABLE: list[tuple[str, str]] = [
    ("keys-optional", "memory"),
    ("keys-optional", "http"),
    ("no-caller", "direct"),
    ("no-caller", "http-stateless"),
    ("fail-open", "memory"),
    ("fail-open", "http"),
    ("underived", "memory"),
    ("not-chosen", "memory"),
]
INTEGRATIONS = ["decorator", "install", "lowlevel"]


@pytest.mark.parametrize(
    ("integration", "path", "transport"),
    [
        (integration, path, transport)
        for integration in INTEGRATIONS
        for path, transport in TABLE
        # A function without @idempotent is the decorator's "not chosen": nothing to compare.
        if not (integration == "decorator" and path == "not-chosen")
    ],
)
async def test_a_call_the_guard_passes_through_is_the_sdks_own(
    integration: str, path: str, transport: str
) -> None:
    key = meta("k") if path in ("fail-open", "not-chosen") else None
    seen: dict[bool, dict[str, Any]] = {}
    counts: dict[bool, int] = {}
    with anyio.fail_after(SOON):
        for guarded in (False, True):
            ledger = Ledger()
            server = build(integration, path, ledger, guarded)
            async with caller(server, transport) as call:
                for kind, (name, args) in CALLS.items():
                    with logged("mcp.server", "idempotency") as lines:
                        outcome = await call(name, args, key)
                    # A traceback through a wrapped function has the wrapper's frames (the
                    # decorator wraps the function): compare what was raised, not the frames.
                    sdk = [
                        (*line[:3], line[3].rstrip().rsplit("\n", 1)[-1])
                        for line in lines.of("mcp.server")
                    ]
                    ours = lines.of("idempotency")
                    seen.setdefault(guarded, {})[kind] = (outcome, sdk, ours)
            counts[guarded] = ledger.count
    assert counts == {False: 1, True: 1}
    for kind in CALLS:
        theirs, ours = seen[False][kind], seen[True][kind]
        assert ours[0] == theirs[0], kind  # the whole answer, field by field
        assert ours[1] == theirs[1], kind  # the SDK server's log lines
        if path != "fail-open":
            assert ours[2] == [], kind  # the guard says nothing where it protects nothing
        outcome = ours[0]
        if outcome[0] == "result":
            assert wire.IDEMPOTENCY_META not in outcome[1].get("_meta", {}), kind
    # Not vacuous: errors are errors.
    errors = {kind: seen[False][kind][0] for kind in ("body-raises", "mcp-error")}
    assert errors["mcp-error"][0] == "error" or errors["mcp-error"][1]["isError"] is True


@pytest.mark.parametrize("integration", ["decorator", "install"])
async def test_in_process_calls_raise_what_the_sdk_raises(integration: str) -> None:
    """`MCPServer.call_tool` of a guarded server (no request, so nothing to key): the SDK's own
    exceptions, types and texts."""
    outcomes: dict[bool, list[Any]] = {}
    for guarded in (False, True):
        server = build(integration, "no-caller", Ledger(), guarded)
        async with caller(server, "inproc") as call:
            outcomes[guarded] = [await call(n, a, None) for n, a in CALLS.values()]
    assert outcomes[True] == outcomes[False]
    assert {o[1] for o in outcomes[False] if o[0] == "raised"} >= {"ToolError", "MCPError"}


async def test_a_read_only_tool_runs_each_keyless_call_and_replays_a_keyed_retry() -> None:
    runs: list[str] = []
    store = MemoryKeyStore()
    server = MCPServer("shop")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    @idempotent(store)
    async def look(order: str) -> str:
        runs.append(order)
        return f"read {len(runs)}"

    async with Client(server, mode="legacy") as client:
        (listed,) = (await client.list_tools()).tools
        keyless = [await client.call_tool("look", {"order": "o"}) for _ in "12"]
        keyed = [await client.call_tool("look", {"order": "o"}, meta=meta("r")) for _ in "12"]
    assert len(runs) == 3
    assert [r.content[0].text for r in keyless] == ["read 1", "read 2"]  # type: ignore[union-attr]
    assert [(r.meta or {})[wire.IDEMPOTENCY_META]["status"] for r in keyed] == [
        "executed",
        "replayed",
    ]
    assert (listed.meta or {})[wire.IDEMPOTENCY_META]["keys"] == "optional"


@pytest.mark.parametrize("integration", INTEGRATIONS)
async def test_the_guards_span_is_a_child_of_the_sdks_request_span(integration: str) -> None:
    """One SERVER span per tools/call, the SDK's (`tools/call charge`), guarded or not; the
    guard's span under it for a keyed call, and none for a call passed through."""
    spans = recorder()
    seen: dict[str, list[Shape]] = {}
    for setup in ("unguarded", "keyed", "passed-through"):
        server = build(integration, "keys-optional", Ledger(), setup != "unguarded")
        async with caller(server, "memory") as call:
            spans.clear()
            await call("charge", ARGS, meta("s") if setup == "keyed" else None)
            seen[setup] = shapes(spans.get_finished_spans())
    for found in seen.values():
        requests = [s for s in found if s.kind == "SERVER" and s.name.startswith("tools/call")]
        assert [(s.name, s.status) for s in requests] == [("tools/call charge", "UNSET")]
    assert [s for s in seen["keyed"] if s.name.startswith("mcp-once guard")] == [
        Shape("mcp-once guard charge", "INTERNAL", "UNSET", "tools/call charge")
    ]
    assert seen["passed-through"] == seen["unguarded"]


@pytest.mark.parametrize("integration", INTEGRATIONS)
async def test_the_guards_span_of_a_refused_call_carries_the_error(integration: str) -> None:
    """A call the guard answers with an error (here a malformed key: -32602) has the guard's
    span marked as `start_as_current_span` would mark it: status ERROR and `error.type` the
    JSON-RPC code, never the message (it may quote the arguments)."""
    spans = recorder()
    server = build(integration, "keys-optional", Ledger(), True)
    async with caller(server, "memory") as call:
        spans.clear()
        outcome = await call("charge", ARGS, meta(""))
    assert outcome[:2] == ("error", wire.INVALID_PARAMS)
    (guard,) = [s for s in spans.get_finished_spans() if s.name == "mcp-once guard charge"]
    assert guard.status.status_code.name == "ERROR"
    assert guard.status.description == str(wire.INVALID_PARAMS)
    assert (guard.attributes or {}).get("error.type") == str(wire.INVALID_PARAMS)
    assert (guard.attributes or {}).get("mcp_once.outcome") == "invalid"
