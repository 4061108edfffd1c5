"""`@idempotent` cannot guard a FastMCP tool (FastMCP never hands it the SDK's `Context`), so every
way of trying raises a `TypeError` naming `IdempotencyMiddleware`: at decoration, at registration,
and at call time as the backstop. Nothing ever runs unguarded while looking guarded."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import FastMCP
from fastmcp.tools import tool
from fastmcp.tools.function_tool import FunctionTool
from fastmcp_kit import serving
from server_kit import Effects, meta

from idempotency import MemoryKeyStore, idempotent, install

pytestmark = pytest.mark.anyio

NAMES_THE_FIX = "IdempotencyMiddleware"


def guarded(effects: Effects) -> Any:
    """A fresh guarded function per test (a registered function cannot be wrapped later)."""

    @idempotent(MemoryKeyStore())
    async def charge(order: str, cents: int) -> str:
        return await effects.charge(order, cents, gated=False)

    return charge


def test_mcp_tool_over_idempotent_is_refused() -> None:
    mcp: FastMCP[Any] = FastMCP("shop")
    with pytest.raises(TypeError, match=NAMES_THE_FIX):
        mcp.tool(guarded(Effects()))


def test_named_mcp_tool_over_idempotent_is_refused() -> None:
    mcp: FastMCP[Any] = FastMCP("shop")
    with pytest.raises(TypeError, match=NAMES_THE_FIX):
        mcp.tool(name="pay")(guarded(Effects()))


def test_add_tool_of_a_guarded_function_is_refused() -> None:
    mcp: FastMCP[Any] = FastMCP("shop")
    with pytest.raises(TypeError, match=NAMES_THE_FIX):
        mcp.add_tool(guarded(Effects()))


def test_standalone_tool_decorator_then_add_tool_is_refused() -> None:
    mcp: FastMCP[Any] = FastMCP("shop")
    marked = tool(guarded(Effects()))
    with pytest.raises(TypeError, match=NAMES_THE_FIX):
        mcp.add_tool(marked)


def test_idempotent_over_mcp_tool_is_refused_at_decoration() -> None:
    mcp: FastMCP[Any] = FastMCP("shop")
    with pytest.raises(TypeError, match=NAMES_THE_FIX):

        @idempotent(MemoryKeyStore())
        @mcp.tool
        async def charge(order: str) -> str:
            return order


def test_idempotent_over_a_function_fastmcp_registered_is_refused() -> None:
    mcp: FastMCP[Any] = FastMCP("shop")

    async def charge(order: str) -> str:
        return order

    mcp.add_tool(charge)
    with pytest.raises(TypeError, match=NAMES_THE_FIX):
        idempotent(MemoryKeyStore())(charge)


def test_idempotent_over_the_standalone_tool_decorator_is_refused() -> None:
    with pytest.raises(TypeError, match=NAMES_THE_FIX):

        @idempotent(MemoryKeyStore())
        @tool
        async def charge(order: str) -> str:
            return order


def test_install_on_a_fastmcp_server_is_refused() -> None:
    with pytest.raises(TypeError, match=NAMES_THE_FIX):
        install(FastMCP("shop"), MemoryKeyStore())  # type: ignore[arg-type]


async def test_call_time_backstop_never_runs_the_tool_unguarded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A registration the hook could not see (FastMCP loaded after `idempotent(...)` ran, say):
    every call raises before the tool body, and the error names the fix."""
    original = FunctionTool.from_function.__func__.__wrapped__  # type: ignore[attr-defined]
    monkeypatch.setattr(FunctionTool, "from_function", classmethod(original))
    effects = Effects()
    mcp: FastMCP[Any] = FastMCP("shop")
    mcp.tool(guarded(effects))
    monkeypatch.undo()
    async with serving(mcp, "memory") as connect, connect() as client:
        results = [
            await client.call_tool_mcp("charge", {"order": "o", "cents": 1}, meta=meta("k"))
            for _ in "12"
        ]
    assert effects.count == 0 and not effects.started.is_set()
    for result in results:
        assert result.is_error is True
        assert NAMES_THE_FIX in str(result.content[0])
