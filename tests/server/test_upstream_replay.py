"""Rule 18's marker truth, in the guard itself, on every store: a guarded tool whose result is the
answer of an mcp-once-guarded server it called (the proxy's tools are such tools), and which that
server *replayed*, is reported as a replay (`status: replayed`, `upstream: true`, the upstream's
`executedAt`), never as `executed`; the record keeps it so (its own replays say it too), and its
history's completed event says `upstream=replayed` (the Redis store writes it in `complete.lua`).
A result without such a marker is stamped as ever.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp.client import Client
from mcp.server import Server
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)
from server_kit import SOON, marker, meta, record_key

from idempotency import KeyStore, idempotent_call_tool, parse_history, wire

pytestmark = pytest.mark.anyio

NAME = "relay"
#: When the upstream executed what it replays (its marker's `executedAt`).
UPSTREAM_EXECUTED_AT = "2026-01-02T03:04:05.678Z"


def relay(store: KeyStore) -> Server:
    """`forward(note)` answers as an upstream did: with its replay marker when `note` is
    "replayed", with its execution marker when "executed", with none otherwise."""

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        note = str((params.arguments or {}).get("note"))
        upstream = {"key": "mcp-once:abc", "keySource": "client", "attempts": 1}
        upstream |= {"status": note, "executedAt": UPSTREAM_EXECUTED_AT}
        answer = CallToolResult(
            content=[TextContent(type="text", text=f"upstream said {note}")],
            _meta={wire.IDEMPOTENCY_META: upstream, "other": 1} if note != "none" else None,
        )
        return answer

    async def list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        schema = {"type": "object", "properties": {"note": {"type": "string"}}}
        return ListToolsResult(tools=[Tool(name="forward", input_schema=schema)])

    guarded = idempotent_call_tool(store, call_tool, server_name=NAME)
    return Server(NAME, on_list_tools=guarded.advertise(list_tools), on_call_tool=guarded)


async def completed_details(store: KeyStore, key: str) -> dict[str, str]:
    events = parse_history(await store.history(record_key(NAME, "forward", key)))  # type: ignore[attr-defined]
    (done,) = [e for e in events if e.kind == "completed"]
    return done.details


async def test_an_upstream_replay_is_reported_as_one_and_kept_so(store: KeyStore) -> None:
    with anyio.fail_after(SOON):
        async with Client(relay(store), mode="legacy") as client:
            first = await client.call_tool("forward", {"note": "replayed"}, meta=meta("k-1"))
            again = await client.call_tool("forward", {"note": "replayed"}, meta=meta("k-1"))
    for answer in (first, again):
        assert marker(answer) == {
            "key": "k-1",
            "keySource": "client",
            "status": "replayed",
            "executedAt": UPSTREAM_EXECUTED_AT,
            "attempts": 1,
            "upstream": True,
        }
        assert (answer.meta or {})["other"] == 1  # the upstream's own entries stay
    assert (await completed_details(store, "k-1"))["upstream"] == "replayed"


@pytest.mark.parametrize("note", ["executed", "none"])
async def test_an_upstream_execution_is_stamped_as_ever(store: KeyStore, note: str) -> None:
    with anyio.fail_after(SOON):
        async with Client(relay(store), mode="legacy") as client:
            first = await client.call_tool("forward", {"note": note}, meta=meta("k-2"))
            again = await client.call_tool("forward", {"note": note}, meta=meta("k-2"))
    assert marker(first)["status"] == "executed" and marker(again)["status"] == "replayed"
    assert wire.MARKER_UPSTREAM not in marker(first) and wire.MARKER_UPSTREAM not in marker(again)
    assert marker(first)["executedAt"] != UPSTREAM_EXECUTED_AT  # the guard's own time
    assert "upstream" not in await completed_details(store, "k-2")
