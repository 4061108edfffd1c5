"""The pass-through fast path (`mcp_once/proxy/fast_path.py`), held to what FastMCP's path did: a
call the proxy does not guard reaches the upstream once, as it came, and answers as it answered,
without FastMCP's tool run; a middleware a user adds afterwards sees every call again (FastMCP's
path); a guarded call asks FastMCP for its tool once, not once per layer. A stdio Python upstream
with an effect ledger (`changing_server.py`), the proxy in this process (the slow tier: each
test starts the upstream as a child)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client, FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp_types import CallToolRequestParams
from proxy_kit import HERE, MARKER, lines

from idempotency import MemoryKeyStore
from mcp_once.proxy import OnceProxy, Upstream, build_proxy
from mcp_once.proxy.tools import OnceProxyTool

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]


@asynccontextmanager
async def _proxy(ledger: Path) -> AsyncIterator[tuple[OnceProxy, Client[Any]]]:
    upstream = Upstream.stdio(sys.executable, str(HERE / "changing_server.py"), str(ledger))
    proxy = build_proxy(upstream, MemoryKeyStore())
    async with proxy.opened(), Client(proxy) as client:
        # `write` read-only from now on: its calls pass through.
        await client.call_tool(
            "turn_read_only", {}, meta={"io.github.mcp-once/idempotency-key": "k"}
        )
        await client.list_tools()
        yield proxy, client


def _count_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the proxied tools FastMCP runs from now on."""
    runs: list[str] = []
    original = OnceProxyTool.run

    async def run(self: OnceProxyTool, *args: Any, **kwargs: Any) -> Any:
        runs.append(self.name)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(OnceProxyTool, "run", run)
    return runs


async def test_a_pass_through_call_goes_upstream_once_without_fastmcp_s_run(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "effects"
    async with _proxy(ledger) as (_, client):
        runs = _count_runs(monkeypatch)
        result = await client.call_tool("write", {"text": "once"})
        assert runs == [], "a pass-through call took FastMCP's path"
        assert lines(ledger) == 1
        assert result.content[0].text == "wrote once"  # type: ignore[union-attr]
        assert result.structured_content == {"result": "wrote once"}
        assert MARKER not in (result.meta or {})  # passed through: nothing stored, no marker


async def test_a_middleware_added_after_the_build_sees_every_call(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []

    class Watch(Middleware):
        async def on_call_tool(
            self, context: MiddlewareContext[CallToolRequestParams], call_next: CallNext[Any, Any]
        ) -> Any:
            seen.append(context.message.name)
            return await call_next(context)

    ledger = tmp_path / "effects"
    async with _proxy(ledger) as (proxy, client):
        proxy.add_middleware(Watch())
        runs = _count_runs(monkeypatch)
        await client.call_tool("write", {"text": "watched"})
        assert seen == ["write"] and runs == ["write"]
        assert lines(ledger) == 1


async def test_a_guarded_call_looks_its_tool_up_once(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy's guard choice, the guard's own lookup and FastMCP's run each ask for the tool;
    FastMCP's lookup (every provider, every visibility transform) runs once for all three."""
    looked_up: list[str] = []
    original = FastMCP.get_tool

    async def get_tool(self: FastMCP[Any], name: str, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(name)
        return await original(self, name, *args, **kwargs)

    upstream = Upstream.stdio(
        sys.executable, str(HERE / "changing_server.py"), str(tmp_path / "effects")
    )
    proxy = build_proxy(upstream, MemoryKeyStore())
    async with proxy.opened(), Client(proxy) as client:
        await client.list_tools()
        monkeypatch.setattr(FastMCP, "get_tool", get_tool)
        result = await client.call_tool(
            "write", {"text": "guarded"}, meta={"io.github.mcp-once/idempotency-key": "k1"}
        )
        assert (result.meta or {})[MARKER]["status"] == "executed"
        assert looked_up == ["write"]
