"""The tool catalog follows pagination and feeds the gate; logs never carry arguments."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from _faults import Faults, faulty_transport
from _servers import Recorder, make_server
from mcp import Client
from mcp.server import Server
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
    ToolAnnotations,
)

from orchestrator import OutcomeUnknown, RetryingSession, RetryPolicy

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])]

PAGES = 3


def paginated_server(calls: list[str]) -> Server[Any]:
    """Tool `t{i}` lives on page i; odd pages' tools are idempotent."""

    def tool(i: int) -> Tool:
        hints = ToolAnnotations(idempotent_hint=i % 2 == 1)
        return Tool(name=f"t{i}", input_schema={"type": "object"}, annotations=hints)

    async def on_list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        page = int(params.cursor) if params is not None and params.cursor else 0
        following = str(page + 1) if page + 1 < PAGES else None
        return ListToolsResult(tools=[tool(page)], next_cursor=following)

    async def on_call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        calls.append(params.name)
        return CallToolResult(content=[TextContent(type="text", text=params.name)])

    return Server("paged", on_list_tools=on_list_tools, on_call_tool=on_call_tool)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_gate_reads_annotations_from_every_page(mode: str) -> None:
    calls: list[str] = []
    server = paginated_server(calls)
    faults = Faults(plan={"t1": ["drop"], "t2": ["drop"]})
    async with RetryingSession(
        connect=lambda: Client(faulty_transport(server, faults), mode=mode),  # type: ignore[arg-type]
        policy=RetryPolicy(attempt_timeout=0.2),
    ) as rs:
        tools = await rs.refresh_tools()
        assert [t.name for t in tools] == ["t0", "t1", "t2"]
        await rs.call_tool("t1")  # page 2 of 3: idempotent, retried
        with pytest.raises(OutcomeUnknown):
            await rs.call_tool("t2")  # page 3: not idempotent
    assert calls == ["t1", "t1", "t2"]


async def test_logs_never_carry_arguments_or_results(caplog: pytest.LogCaptureFixture) -> None:
    recorder, faults = Recorder(), Faults(plan={"idem": ["drop"], "plain": ["drop"]})
    server = make_server(recorder)
    caplog.set_level(logging.DEBUG, logger="orchestrator")
    async with RetryingSession(
        connect=lambda: Client(faulty_transport(server, faults)),
        policy=RetryPolicy(attempt_timeout=0.2),
    ) as rs:
        await rs.call_tool("idem", {"x": 918273645})
        with pytest.raises(OutcomeUnknown):
            await rs.call_tool("plain", {"x": 918273645})
    orchestrator_records = [r for r in caplog.records if r.name == "orchestrator"]
    assert any("retrying" in r.getMessage() for r in orchestrator_records)
    assert any(r.levelno == logging.WARNING for r in orchestrator_records)
    for record in orchestrator_records:
        assert "918273645" not in record.getMessage()
