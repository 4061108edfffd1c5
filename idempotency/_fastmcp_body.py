"""Whether a FastMCP tool's body started: the line between "refused" and "ran" on FastMCP.

FastMCP runs far more than the tool's body below a middleware: other middleware, its component
auth, tool lookup, argument validation. A failure there happened before any effect, and must
not become the key's stored answer (a transient fault of an inner middleware would otherwise be
replayed to every retry, and the tool would never run). A failure after the body started may
follow an effect, and is the key's answer.

FastMCP enters every tool it runs through one method, `Tool._run` (the server calls it instead
of `run()`; `FastMCPProviderTool` overrides it to delegate to a mounted server, whose own tools
enter through it in turn). The guard wraps that method once, process-wide: the wrapper marks the
watch the guard opened for the current call and runs the method unchanged. Outside a guarded
call there is no watch, and the wrapper does nothing else.

The same seam keeps the guard from being bypassed where it passes a call through because it
found no tool: FastMCP then answers as without the guard ("Unknown tool"), but should anything
below resolve the call to a tool after all (a middleware inside the guard that renames it, a
tool registered in between), the watch refuses to enter it — with FastMCP's own not-found error
for the name the guard was asked — rather than let it run unguarded.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from fastmcp.exceptions import NotFoundError
from fastmcp.tools.base import Tool, ToolResult

_PATCHED = "__mcp_once_body_watch__"


@dataclass(slots=True)
class BodyWatch:
    """Set when FastMCP enters a tool during the watched call; `unknown`: the name the guard
    found no tool for, whose call must not enter one."""

    started: bool = False
    unknown: str | None = None


_watch: ContextVar[BodyWatch | None] = ContextVar("mcp_once_fastmcp_body", default=None)


def install_body_watch() -> None:
    """Wrap `Tool._run` once per process (idempotent)."""
    original: Callable[[Tool, dict[str, Any]], Awaitable[ToolResult]] = Tool._run
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    async def _run(self: Tool, arguments: dict[str, Any]) -> ToolResult:
        watch = _watch.get()
        if watch is not None:
            if watch.unknown is not None:
                raise NotFoundError(f"Unknown tool: {watch.unknown!r}")
            watch.started = True
        return await original(self, arguments)

    setattr(_run, _PATCHED, True)
    Tool._run = _run  # type: ignore[method-assign]


@contextmanager
def watching_body(unknown: str | None = None) -> Iterator[BodyWatch]:
    """A fresh watch for the call run inside this block (`unknown`: see `BodyWatch`)."""
    watch = BodyWatch(unknown=unknown)
    token = _watch.set(watch)
    try:
        yield watch
    finally:
        _watch.reset(token)
