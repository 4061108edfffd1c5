"""The proxy's tool lookup (`mcp_once/proxy/lookup.py`): FastMCP's answers, without a task per
provider.

`lookup.in_turn` is FastMCP's `_get_tool` with its providers asked one after the other: here its
answers are held equal to FastMCP's own lookup's on a server with every case the lookup decides
(versions across providers, a provider's error under both error strategies, a provider's
`NotFoundError`, a tool its component auth refuses, an unknown name), the copied FastMCP code is
pinned, and a proxy's `tools/call` is shown to go through it.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client, FastMCP
from fastmcp.exceptions import NotFoundError
from fastmcp.server.providers import Provider
from fastmcp.server.providers.aggregate import AggregateProvider
from fastmcp.tools.base import Tool
from fastmcp.utilities.authorization import require_scopes
from fastmcp.utilities.versions import VersionSpec
from proxy_kit import HERE, MARKER, source_hashes

from idempotency import MemoryKeyStore
from mcp_once._upstream import Upstream
from mcp_once.proxy import OnceProxy, build_proxy
from mcp_once.proxy.lookup import in_turn

BACKENDS = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])


class Failing(Provider):
    """A provider whose lookup of `boom` fails, and of `gone` says it has no such tool the way
    FastMCP's own providers may (`NotFoundError`)."""

    async def _get_tool(self, name: str, version: VersionSpec | None = None) -> Tool | None:
        if name == "boom":
            raise RuntimeError("the provider failed")
        if name == "gone":
            raise NotFoundError(f"Unknown tool: {name!r}")
        return None


def _server(strategy: str) -> FastMCP[Any]:
    server: FastMCP[Any] = FastMCP("lookups")

    @server.tool
    def plain() -> str:
        return "plain"

    @server.tool(version="1")
    def versioned() -> str:
        return "v1"

    @server.tool(auth=require_scopes("admin"))
    def guarded() -> str:
        return "admin only"

    @server.tool
    def boom() -> str:
        return "local boom"

    @server.tool
    def gone() -> str:
        return "local gone"

    child: FastMCP[Any] = FastMCP("child")

    @child.tool(name="versioned", version="2")
    def versioned_two() -> str:
        return "v2"

    server.mount(child)
    server.add_provider(Failing())
    server.provider_error_strategy = strategy  # type: ignore[assignment]
    return server


async def _answer(lookup: Any, *args: Any) -> tuple[str, Any]:
    try:
        tool = await lookup(*args)
    except Exception as exc:
        return ("raised", (type(exc), str(exc)))
    return ("tool", None if tool is None else (tool.name, tool.version, tool.key))


@BACKENDS
@pytest.mark.parametrize("strategy", ["raise", "warn"])
async def test_in_turn_answers_as_fastmcp_s_own_lookup(anyio_backend: str, strategy: str) -> None:
    server = _server(strategy)
    cases = [
        ("plain", None),
        ("versioned", None),
        ("versioned", VersionSpec(eq="1")),
        ("versioned", VersionSpec(lt="2")),
        ("guarded", None),
        ("boom", None),
        ("gone", None),
        ("unknown", None),
    ]
    for name, version in cases:
        ours = await _answer(in_turn, server, name, version)
        theirs = await _answer(FastMCP._get_tool, server, name, version)
        assert ours == theirs, (name, version)
    # The cases decide what they are meant to: each kind of answer is among them.
    assert await _answer(in_turn, server, "versioned", None) == (
        "tool",
        ("versioned", "2", "tool:versioned@2"),
    )
    assert await _answer(in_turn, server, "guarded", None) == ("tool", None)
    assert (await _answer(in_turn, server, "gone", None))[1] is not None
    boom = await _answer(in_turn, server, "boom", None)
    assert boom[0] == ("raised" if strategy == "raise" else "tool")


@asynccontextmanager
async def _spied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: FastMCP[Any] | None = None
) -> AsyncIterator[tuple[OnceProxy, Client[Any], list[str]]]:
    """A proxy of a stdio upstream (with `extra` mounted on it), a client of it, and the names
    the proxy's own aggregate lookup (FastMCP's, its providers gathered in a task group) is
    asked from the first `tools/call` on."""
    gathered: list[str] = []
    original = AggregateProvider._get_tool

    async def counted(self: AggregateProvider, name: str, version: Any = None) -> Any:
        if self is proxy:
            gathered.append(name)
        return await original(self, name, version)

    upstream = Upstream.stdio(
        sys.executable, str(HERE / "changing_server.py"), str(tmp_path / "effects")
    )
    proxy = build_proxy(upstream, MemoryKeyStore())
    if extra is not None:
        proxy.mount(extra)
    async with proxy.opened(), Client(proxy) as client:
        await client.list_tools()
        monkeypatch.setattr(AggregateProvider, "_get_tool", counted)
        yield proxy, client, gathered


async def _guarded_write(client: Client[Any]) -> None:
    result = await client.call_tool(
        "write", {"text": "guarded"}, meta={"io.github.mcp-once/idempotency-key": "k1"}
    )
    assert (result.meta or {})[MARKER]["status"] == "executed"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_proxied_call_looks_its_tool_up_without_a_task_per_provider(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guarded call through the proxy finds its tool by `in_turn`: FastMCP's aggregate lookup
    (its providers gathered in a task group) is not asked."""
    async with _spied(tmp_path, monkeypatch) as (proxy, client, gathered):
        await _guarded_write(client)
        assert gathered == []
        assert (await FastMCP._get_tool(proxy, "write")) is not None  # the spy does see a lookup
        assert gathered == ["write"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_proxy_a_user_mounted_more_on_keeps_fastmcp_s_lookup(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the proxy's own two providers are asked in turn: with a server of the user's mounted
    on it, FastMCP's aggregate lookup finds the tools (both the upstream's and the mounted
    one's), as without mcp-once's."""
    extra: FastMCP[Any] = FastMCP("extra")

    @extra.tool
    def hello() -> str:
        return "hello"

    async with _spied(tmp_path, monkeypatch, extra) as (_, client, gathered):
        await _guarded_write(client)
        assert (await client.call_tool("hello", {})).data == "hello"
        assert gathered == ["write", "hello"]


#: sha256 of the pinned FastMCP's (4.1.6) methods that `lookup.in_turn` copies.
PINNED = {
    "FastMCP._get_tool": "ecdb3b1bf5789069ddbf2ca6bfd0909d232ba3f6fc22a40f56e0872e28b1fe0b",
    "AggregateProvider._get_tool": (
        "aba4f818c2128f6dba17495e1dc38370e9de261f050562094a6f94bac2e4d054"
    ),
}


def test_the_copied_fastmcp_code_is_the_pinned_fastmcp_s() -> None:
    """`lookup.in_turn` is `FastMCP._get_tool` over `AggregateProvider._get_tool` with the gather
    written as a loop: a FastMCP that changes either fails here, to re-check
    `mcp_once/proxy/lookup.py` against it and then update the pin."""
    owners: dict[str, Any] = {"FastMCP": FastMCP, "AggregateProvider": AggregateProvider}
    assert source_hashes(owners, PINNED) == PINNED, (
        "the FastMCP code mcp_once/proxy/lookup.py copies changed: re-check in_turn against"
        " it, then update PINNED"
    )
