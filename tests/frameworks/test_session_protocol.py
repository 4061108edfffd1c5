"""The session protocol and the packaging promise: frameworks are imported only when used.

`RetryingSession` drives any `ToolSession`; the three clients it knows get adapters. Importing
`orchestrator` (and using it with the SDK's own client) must not import any agent framework:
each integration is an optional extra.
"""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.shared.dispatcher import ProgressFnT
from mcp_types import CallToolResult, ListToolsResult, RequestParamsMeta

from idempotency import wire
from mcp_once.scenarios._ledger import Ledger
from mcp_once.scenarios._shop import build_server
from orchestrator import RetryingSession, ToolSession, tool_session

FRAMEWORKS = ("fastmcp", "pydantic_ai", "agents", "openai")


def test_importing_orchestrator_imports_no_framework() -> None:
    code = (
        "import sys, orchestrator, orchestrator.chaos\n"
        "from mcp.server.mcpserver import MCPServer\n"
        "from mcp import Client\n"
        "orchestrator.RetryingSession(Client(MCPServer('x')))\n"
        f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_a_plain_fastmcp_client_finds_its_adapter_unasked() -> None:
    """The core never imports an integration: it finds `orchestrator.fastmcp` by the client's
    package, so a `fastmcp.Client` is driven even when nobody imported the integration."""
    code = (
        "import sys, fastmcp, orchestrator\n"
        "client = fastmcp.Client('http://127.0.0.1:9/mcp')\n"
        "before = 'orchestrator.fastmcp' in sys.modules\n"
        "orchestrator.RetryingSession(client)\n"
        "print(before, 'orchestrator.fastmcp' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "False True"


def test_a_new_integration_is_one_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """An `orchestrator.<package>` module with an `as_tool_session` hook adapts the clients of
    the framework `<package>` (subclasses too); nothing else is registered anywhere."""

    class FrameworkClient:
        pass

    FrameworkClient.__module__ = "someframework.client"

    class Subclassed(FrameworkClient):
        pass

    class Elsewhere:
        pass

    Elsewhere.__module__ = "otherframework.client"
    adapted = Recording(Client(MCPServer("x")))
    integration = types.ModuleType("orchestrator.someframework")
    integration.as_tool_session = lambda obj: (  # type: ignore[attr-defined]
        adapted if isinstance(obj, FrameworkClient) else None
    )
    monkeypatch.setitem(sys.modules, "orchestrator.someframework", integration)
    assert tool_session(FrameworkClient()) is adapted
    assert tool_session(Subclassed()) is adapted
    with pytest.raises(TypeError, match="ToolSession"):
        tool_session(Elsewhere())


def test_what_cannot_be_driven_is_refused() -> None:
    with pytest.raises(TypeError, match="ToolSession"):
        RetryingSession(object())  # type: ignore[arg-type]


class Recording:
    """A user's own `ToolSession` over an SDK client, counting what the loop asked of it."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.calls: list[RequestParamsMeta | None] = []
        self.pages = 0

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        read_timeout_seconds: float | None,
        progress_callback: ProgressFnT | None,
        *,
        meta: RequestParamsMeta | None,
    ) -> CallToolResult:
        self.calls.append(meta)
        return await self.client.call_tool(name, arguments, read_timeout_seconds, meta=meta)

    async def list_tools_page(self, cursor: str | None) -> ListToolsResult:
        self.pages += 1
        return await self.client.list_tools(cursor=cursor)

    def closed(self) -> bool:
        return False

    def watch_list_changed(self, on_change: Callable[[], None]) -> bool:
        return False


@pytest.mark.anyio
async def test_a_tool_session_of_ones_own_is_driven_as_it_is(tmp_path: Path) -> None:
    server = build_server(None, Ledger(tmp_path / "ledger.sqlite3"))
    async with Client(server) as client:
        mine = Recording(client)
        assert isinstance(mine, ToolSession)
        session = RetryingSession(mine)
        result = await session.call_tool(
            "set_value", {"call_id": "c-1", "name": "n", "value": 1}, idempotency_key="k-1"
        )
    assert not result.is_error
    assert mine.pages == 1  # the gate's catalog was listed through the protocol
    (meta,) = mine.calls
    assert meta is not None and meta[wire.KEY_META] == "k-1" and meta[wire.ATTEMPT_META] == 1
