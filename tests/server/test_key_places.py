"""Issue #24 on the mcp SDK's entry points: keys from a tool argument (`key_argument`) and from
the HTTP `Idempotency-Key` header (`key_header`), for clients that cannot write request `_meta`.

Real sessions (in memory, streamable HTTP in both protocol eras) against `@idempotent`, `install()`
and the low-level handler; effects are counted by the tool body (`Effects`), and "nothing written"
is read from the store itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import MCPError
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)
from server_kit import Effects, effect_server, marker, meta, serve_http

from idempotency import KeyStore, MemoryKeyStore, idempotent, idempotent_call_tool, install, wire
from idempotency._guard.keyplaces import KEY_ARGUMENT_DESCRIPTION

pytestmark = pytest.mark.anyio

ARGS: dict[str, Any] = {"order": "o", "cents": 1}
SETTINGS = ["memory", "http-legacy", "http-modern"]
BAD_KEYS: list[tuple[object, str]] = [
    ("", "must not be empty"),
    ("k" * 256, "at most 255"),
    (42, "must be a string"),
    (None, "must be a string"),
    ("a\nb", "printable ASCII"),
    ("caf\u00e9", "printable ASCII"),
]


def with_key(path: str, key: object, arguments: dict[str, Any] = ARGS) -> dict[str, Any]:
    """`arguments` with `key` at the dotted `path`."""
    out: dict[str, Any] = dict(arguments)
    node = out
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = key
    return out


@asynccontextmanager
async def connected(
    server: MCPServer, setting: str, headers: dict[str, str] | None = None
) -> AsyncIterator[tuple[Client, httpx2.AsyncClient | None]]:
    """A client in `setting`, and (over HTTP) its HTTP client, whose headers a test may set
    between calls."""
    if setting == "memory":
        async with Client(server, mode="legacy") as client:
            yield client, None
        return
    async with (
        serve_http(server.streamable_http_app()) as base,
        httpx2.AsyncClient(headers=headers or {}) as http,
        Client(
            streamable_http_client(f"{base}/mcp", http_client=http),
            mode="auto" if setting == "http-modern" else "legacy",
        ) as client,
    ):
        yield client, http


async def refused(client: Client, tool: str, arguments: dict[str, Any], **kw: Any) -> MCPError:
    with pytest.raises(MCPError) as caught:
        await client.call_tool(tool, arguments, **kw)
    return caught.value


def text(result: CallToolResult) -> str:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return first.text


# --- the key in an argument ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["idempotency_key", "meta.idempotency-key"])
@pytest.mark.parametrize("setting", SETTINGS)
async def test_argument_key_replays_and_a_new_key_runs_again(setting: str, path: str) -> None:
    effects = Effects()
    server = effect_server(
        MemoryKeyStore(), effects, gated=False, keys="optional", key_argument=path
    )
    async with connected(server, setting) as (client, _):
        first = await client.call_tool("charge", with_key(path, "k-1"))
        again = await client.call_tool("charge", with_key(path, "k-1"))
        other = await client.call_tool("charge", with_key(path, "k-2"))
    assert effects.count == 2
    assert text(first) == text(again) == "charged 1 for o (execution 1)"
    assert marker(first)["status"] == "executed"
    assert marker(again) | {"status": "x"} == marker(first) | {"status": "x"}
    assert marker(again)["status"] == "replayed"
    assert marker(again)["key"] == "k-1" and marker(again)["keySource"] == "client"
    assert text(other) == "charged 1 for o (execution 2)"


async def test_meta_and_argument_keys_that_agree_are_one_key() -> None:
    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects, gated=False, key_argument="idempotency_key")
    async with Client(server, mode="legacy") as client:
        await client.call_tool("charge", ARGS, meta=meta("k"))
        by_argument = await client.call_tool("charge", with_key("idempotency_key", "k"))
        both = await client.call_tool("charge", with_key("idempotency_key", "k"), meta=meta("k"))
    assert effects.count == 1
    assert marker(by_argument)["status"] == marker(both)["status"] == "replayed"


async def test_the_body_gets_the_key_argument_only_when_it_declares_it() -> None:
    server = MCPServer("shop")
    seen: list[dict[str, Any]] = []

    @server.tool()
    @idempotent(MemoryKeyStore(), key_argument="idempotency_key")
    def plain(order: str) -> str:
        seen.append({"order": order})
        return "ok"

    @server.tool()
    @idempotent(MemoryKeyStore(), key_argument="idempotency_key")
    def declared(order: str, idempotency_key: str | None = None) -> str:
        seen.append({"order": order, "idempotency_key": idempotency_key})
        return "ok"

    async with Client(server, mode="legacy") as client:
        await client.call_tool("plain", {"order": "o", "idempotency_key": "k1"})
        await client.call_tool("declared", {"order": "o", "idempotency_key": "k2"})
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert seen == [{"order": "o"}, {"order": "o", "idempotency_key": "k2"}]
    # The author's own property stands as written, gaining only the model-facing description.
    declared_key = tools["declared"].input_schema["properties"]["idempotency_key"]
    assert declared_key["description"] == KEY_ARGUMENT_DESCRIPTION
    assert "anyOf" in declared_key


async def test_the_fingerprint_never_counts_the_key_argument() -> None:
    """One key, sent once in `_meta` and once in the argument: the same call, not KEY_REUSED."""
    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects, gated=False, key_argument="k")
    async with Client(server, mode="legacy") as client:
        await client.call_tool("charge", {**ARGS, "k": "same"})
        replay = await client.call_tool("charge", ARGS, meta=meta("same"))
        reused = await refused(client, "charge", {"order": "p", "cents": 1, "k": "same"})
    assert marker(replay)["status"] == "replayed"
    assert reused.code == wire.KEY_REUSED
    assert effects.count == 1


@pytest.mark.parametrize(("key", "reason"), BAD_KEYS)
@pytest.mark.parametrize("path", ["idempotency_key", "meta.idempotency-key"])
async def test_a_bad_argument_key_is_invalid_params_and_nothing_happens(
    path: str, key: object, reason: str
) -> None:
    effects = Effects()
    store = MemoryKeyStore()
    server = effect_server(store, effects, gated=False, key_argument=path)
    async with Client(server, mode="legacy") as client:
        error = await refused(client, "charge", with_key(path, key))
    assert error.code == wire.INVALID_PARAMS
    assert reason in error.error.data["reason"]
    assert f"argument {path!r}" in error.error.message
    assert effects.count == 0
    assert await store.list_records() == []


async def test_a_required_key_may_come_in_the_argument() -> None:
    effects = Effects()
    server = effect_server(
        MemoryKeyStore(), effects, gated=False, keys="required", key_argument="idempotency_key"
    )
    async with Client(server, mode="legacy") as client:
        missing = await refused(client, "charge", ARGS)
        await client.call_tool("charge", with_key("idempotency_key", "k"))
    assert missing.code == wire.INVALID_PARAMS
    assert "argument 'idempotency_key'" in missing.message and wire.KEY_META in missing.message
    assert effects.count == 1


# --- keys that disagree (rule 16) ------------------------------------------------------------


@pytest.mark.parametrize("setting", ["http-legacy", "http-modern"])
async def test_keys_that_disagree_are_refused_naming_both_places(setting: str) -> None:
    effects = Effects()
    store = MemoryKeyStore()
    server = effect_server(
        store, effects, gated=False, key_argument="idempotency_key", key_header="Idempotency-Key"
    )
    async with connected(server, setting) as (client, http):
        assert http is not None
        in_meta_and_argument = await refused(
            client, "charge", with_key("idempotency_key", "a"), meta=meta("b")
        )
        http.headers["Idempotency-Key"] = "h"
        in_meta_and_header = await refused(client, "charge", ARGS, meta=meta("b"))
        in_argument_and_header = await refused(client, "charge", with_key("idempotency_key", "a"))
    for error, places in [
        (in_meta_and_argument, (wire.KEY_META, "argument 'idempotency_key'")),
        (in_meta_and_header, (wire.KEY_META, "HTTP header 'Idempotency-Key'")),
        (in_argument_and_header, ("argument 'idempotency_key'", "HTTP header 'Idempotency-Key'")),
    ]:
        assert error.code == wire.INVALID_PARAMS
        assert all(place in error.message for place in places), error.message
        assert error.error.data["reason"] == "conflicting keys"
    assert effects.count == 0
    assert await store.list_records() == []


# --- the key in the HTTP header --------------------------------------------------------------


@pytest.mark.parametrize("setting", ["http-legacy", "http-modern"])
async def test_a_header_key_deduplicates_a_keyless_body(setting: str) -> None:
    """Under keys="optional" a keyless call runs every time; the header makes it one call."""
    effects = Effects()
    server = effect_server(
        MemoryKeyStore(), effects, gated=False, keys="optional", key_header="Idempotency-Key"
    )
    async with connected(server, setting, {"Idempotency-Key": "h-1"}) as (client, http):
        assert http is not None
        first = await client.call_tool("charge", ARGS)
        again = await client.call_tool("charge", ARGS)
        http.headers["Idempotency-Key"] = "h-2"
        other = await client.call_tool("charge", ARGS)
    assert effects.count == 2
    assert marker(again)["status"] == "replayed" and marker(again)["key"] == "h-1"
    assert marker(first)["status"] == marker(other)["status"] == "executed"


@pytest.mark.parametrize("setting", ["http-legacy", "http-modern"])
async def test_the_header_is_ignored_unless_the_server_opts_in(setting: str) -> None:
    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects, gated=False, keys="optional")
    async with connected(server, setting, {"Idempotency-Key": "h-1"}) as (client, _):
        await client.call_tool("charge", ARGS)
        await client.call_tool("charge", ARGS)
    assert effects.count == 2


@pytest.mark.parametrize(("value", "reason"), [("", "empty"), ("k" * 256, "at most 255")])
async def test_a_bad_header_key_is_invalid_params_and_nothing_happens(
    value: str, reason: str
) -> None:
    effects = Effects()
    store = MemoryKeyStore()
    server = effect_server(store, effects, gated=False, key_header="Idempotency-Key")
    async with connected(server, "http-legacy", {"Idempotency-Key": value}) as (client, _):
        error = await refused(client, "charge", ARGS)
    assert error.code == wire.INVALID_PARAMS
    assert reason in error.error.data["reason"]
    assert "HTTP header 'Idempotency-Key'" in error.message
    assert effects.count == 0
    assert await store.list_records() == []


async def test_a_header_key_with_a_control_character_is_invalid_params() -> None:
    """A tab is the one control character HTTP lets into a header value."""
    effects = Effects()
    store = MemoryKeyStore()
    server = effect_server(store, effects, gated=False, key_header="Idempotency-Key")
    async with connected(server, "http-modern", {"Idempotency-Key": "a\tb"}) as (client, _):
        error = await refused(client, "charge", ARGS)
    assert error.code == wire.INVALID_PARAMS and "printable ASCII" in error.error.data["reason"]
    assert effects.count == 0
    assert await store.list_records() == []


# --- the listing -----------------------------------------------------------------------------


def listed(result: ListToolsResult, name: str) -> dict[str, Any]:
    tool = next(t for t in result.tools if t.name == name)
    return tool.model_dump(by_alias=True, mode="json", exclude_none=True)


@pytest.mark.parametrize("keys", ["optional", "required", "derived"])
async def test_an_argument_keyed_tool_is_listed_retry_safe_with_its_key_place(keys: str) -> None:
    """To every caller, also one without identity (stateless HTTP): any caller can send a key."""
    server = effect_server(
        MemoryKeyStore(), Effects(), keys=keys, key_argument="meta.idempotency-key"
    )
    app = server.streamable_http_app(stateless_http=True)
    async with (
        serve_http(app) as base,
        httpx2.AsyncClient() as http,
        Client(streamable_http_client(f"{base}/mcp", http_client=http), mode="legacy") as client,
    ):
        tool = listed(await client.list_tools(), "charge")
    assert tool["annotations"]["idempotentHint"] is True
    entry = tool["_meta"][wire.IDEMPOTENCY_META]
    assert entry[wire.DEFINITION_KEY_ARGUMENT] == "meta.idempotency-key"
    schema = tool["inputSchema"]
    nested = schema["properties"]["meta"]
    key = nested["properties"]["idempotency-key"]
    assert key["type"] == "string" and key["description"] == KEY_ARGUMENT_DESCRIPTION
    assert key["maxLength"] == wire.MAX_KEY_LENGTH
    required = keys == "required"
    assert ("meta" in schema["required"]) is required
    assert ("idempotency-key" in nested.get("required", [])) is required
    assert set(schema["required"]) - {"meta"} == {"order", "cents"}


@pytest.mark.parametrize("keys", ["optional", "required", "derived"])
async def test_install_and_the_low_level_handler_list_an_argument_keyed_tool_retry_safe(
    keys: str,
) -> None:
    """`install()` and `idempotent_call_tool(...).advertise` list the hint to a caller without
    identity (stateless HTTP) as `@idempotent` does, whatever `keys` says."""
    server = MCPServer("shop")

    @server.tool()
    async def charge(order: str, cents: int) -> str:
        return "charged"

    install(server, MemoryKeyStore(), keys=keys, key_argument="idempotency_key")

    async def handler(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text="charged")])

    guarded = idempotent_call_tool(
        MemoryKeyStore(), handler, keys=keys, key_argument="idempotency_key"
    )

    async def tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        return ListToolsResult(tools=[Tool(name="charge", input_schema={"type": "object"})])

    low = Server("low", on_call_tool=guarded, on_list_tools=guarded.advertise(tools))
    for app in (server.streamable_http_app(stateless_http=True), low):
        if isinstance(app, Server):
            async with Client(app, mode="legacy") as client:
                tool = listed(await client.list_tools(), "charge")
        else:
            async with (
                serve_http(app) as base,
                httpx2.AsyncClient() as http,
                Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client,
            ):
                tool = listed(await client.list_tools(), "charge")
        assert tool["annotations"]["idempotentHint"] is True, app
        entry = tool["_meta"][wire.IDEMPOTENCY_META]
        assert entry[wire.DEFINITION_KEY_ARGUMENT] == "idempotency_key"
        assert ("idempotency_key" in tool["inputSchema"].get("required", [])) is (
            keys == "required"
        )


async def test_install_and_the_low_level_handler_take_the_options() -> None:
    store: KeyStore = MemoryKeyStore()
    effects = Effects()
    server = MCPServer("shop")

    @server.tool()
    async def charge(order: str, cents: int) -> str:
        return await effects.charge(order, cents, gated=False)

    install(server, store, keys="optional", key_argument="idempotency_key")
    async with Client(server, mode="legacy") as client:
        await client.call_tool("charge", with_key("idempotency_key", "k"))
        await client.call_tool("charge", with_key("idempotency_key", "k"))
        schema = (await client.list_tools()).tools[0].input_schema
    assert effects.count == 1
    assert "idempotency_key" in schema["properties"]

    low_effects = Effects()
    received: list[dict[str, Any] | None] = []

    async def handler(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        received.append(params.arguments)
        done = await low_effects.charge("o", 1, gated=False)
        return CallToolResult(content=[TextContent(type="text", text=done)])

    guarded = idempotent_call_tool(
        MemoryKeyStore(), handler, keys="optional", key_argument="idempotency_key"
    )

    async def tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        return ListToolsResult(tools=[Tool(name="charge", input_schema={"type": "object"})])

    low = Server("low", on_call_tool=guarded, on_list_tools=guarded.advertise(tools))
    async with Client(low, mode="legacy") as client:
        await client.call_tool("charge", {"idempotency_key": "k"})
        again = await client.call_tool("charge", {"idempotency_key": "k"})
        bad = await refused(client, "charge", {"idempotency_key": ""})
        tool = listed(await client.list_tools(), "charge")
    assert low_effects.count == 1 and marker(again)["status"] == "replayed"
    assert bad.code == wire.INVALID_PARAMS
    assert received == [{"idempotency_key": "k"}]  # the handler sees the request as sent
    assert tool["inputSchema"]["properties"]["idempotency_key"]["type"] == "string"
    assert tool["annotations"]["idempotentHint"] is True


#: A guarded tool's listing without these options, as main lists it (captured from main's code
#: before issue 24): adding the options must not move a byte of it.
UNCHANGED_LISTING: dict[str, Any] = {
    "_meta": {"io.github.mcp-once/idempotency": {"keys": "derived", "retentionSeconds": 86400}},
    "annotations": {"idempotentHint": True},
    "description": "",
    "inputSchema": {
        "properties": {
            "cents": {"title": "Cents", "type": "integer"},
            "order": {"title": "Order", "type": "string"},
        },
        "required": ["order", "cents"],
        "title": "chargeArguments",
        "type": "object",
    },
    "name": "charge",
    "outputSchema": {
        "properties": {"result": {"title": "Result", "type": "string"}},
        "required": ["result"],
        "title": "chargeOutput",
        "type": "object",
    },
}


async def test_a_tool_without_these_options_is_listed_as_before() -> None:
    for setting in ("memory", "http-legacy"):
        server = effect_server(MemoryKeyStore(), Effects())
        async with connected(server, setting) as (client, _):
            tool = listed(await client.list_tools(), "charge")
        assert tool == UNCHANGED_LISTING, setting


# --- what the fingerprint covers (`fingerprint=`) -------------------------------------------


@pytest.mark.parametrize(
    "option",
    [
        {"exclude": ["sent_at", "trace.id"]},
        {"include": ["order", "cents"]},
        lambda arguments: [arguments["order"], arguments["cents"]],
    ],
    ids=["exclude", "include", "function"],
)
async def test_a_retry_that_changed_only_an_uncovered_field_replays(option: Any) -> None:
    """`sent_at` and `trace` are not the tool's parameters: the SDK drops them before the body,
    but the fingerprint reads the arguments as sent."""
    effects = Effects()
    server = effect_server(
        MemoryKeyStore(), effects, gated=False, key_argument="idempotency_key", fingerprint=option
    )
    sent = with_key("idempotency_key", "k")
    async with Client(server, mode="legacy") as client:
        await client.call_tool("charge", {**sent, "sent_at": "10:00", "trace": {"id": "t1"}})
        replay = await client.call_tool(
            "charge", {**sent, "sent_at": "10:01", "trace": {"id": "t2"}}
        )
        reused = await refused(client, "charge", {**sent, "cents": 2, "sent_at": "10:02"})
    assert marker(replay)["status"] == "replayed"
    assert reused.code == wire.KEY_REUSED
    assert effects.count == 1


@pytest.mark.parametrize(
    "option",
    [
        {"exclude": "sent_at"},
        {"only": ["a"]},
        {"include": ["a"], "exclude": ["b"]},
        {"include": [""]},
        3,
    ],
)
def test_a_fingerprint_option_that_names_nothing_is_refused(option: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        idempotent(MemoryKeyStore(), fingerprint=option)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "option",
    [
        {"key_argument": "a..b"},
        {"key_argument": ""},
        {"key_header": "Bad Header"},
        {"key_argument": 3},
    ],
)
def test_a_key_place_that_names_nothing_is_refused(option: dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError)):
        idempotent(MemoryKeyStore(), **option)
