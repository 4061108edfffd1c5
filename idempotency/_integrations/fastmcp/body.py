"""Whether FastMCP entered a tool: the line between "refused" and "ran" on FastMCP.

FastMCP runs far more than the tool's body below a middleware: other middleware, its component
auth, tool lookup, argument validation. A failure there happened before any effect and must not
become the key's stored answer (a transient fault of an inner middleware would otherwise be
replayed to every retry, and the tool would never run). A failure after FastMCP entered the tool
may follow an effect, and is the key's answer.

The seam: FastMCP's tool path (`FastMCP.call_tool` without middleware) finds the tool, then
labels its span with `tool.get_span_attributes()` and, on the next line, enters the tool
(`tool._run`). Every tool class answers that call through `Tool.get_span_attributes` (the
subclasses extend it with `super()`), and FastMCP makes it whether or not telemetry records. The
guard wraps that method once, process-wide: the wrapper marks the watch the guard opened for the
current call and returns the attributes unchanged. It runs and returns *before* the tool, so it
is in no traceback of the tool's exceptions and in none of FastMCP's logged ones — wrapping
`_run` itself would add a frame to both. Outside a guarded call there is no watch, and the
wrapper does nothing else.

The same seam keeps the guard from being bypassed where it passes a call through because it
found no tool: FastMCP then answers as without the guard ("Unknown tool"), but should anything
below resolve the call to a tool after all (a middleware inside the guard that renames it, a
tool registered in between), the watch refuses to enter it — with FastMCP's not-found text for
the name the guard was asked, as a `ToolError`, which FastMCP renders as its text — rather than
let it run unguarded, and logs why.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from fastmcp.exceptions import ToolError
from fastmcp.tools.base import Tool

from ..._guard.telemetry import logger

_PATCHED = "__mcp_once_body_watch__"


@dataclass(slots=True)
class BodyWatch:
    """Set when FastMCP enters a tool during the watched call; `unknown`: the name the guard
    found no tool for, whose call must not enter one."""

    started: bool = False
    unknown: str | None = None


_watch: ContextVar[BodyWatch | None] = ContextVar("mcp_once_fastmcp_body", default=None)


def install_body_watch() -> None:
    """Wrap `Tool.get_span_attributes` once per process (idempotent)."""
    original: Callable[[Tool], dict[str, Any]] = Tool.get_span_attributes
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def get_span_attributes(self: Tool) -> dict[str, Any]:
        watch = _watch.get()
        if watch is not None:
            if watch.unknown is not None:
                logger.error(
                    "a call of %r, for which the idempotency guard found no tool, reached tool"
                    " %r below the guard (a middleware inside it renamed the call, or the tool"
                    " was registered meanwhile); refused rather than run unguarded",
                    watch.unknown,
                    self.name,
                )
                raise ToolError(f"Unknown tool: {watch.unknown!r}")
            watch.started = True
        return original(self)

    setattr(get_span_attributes, _PATCHED, True)
    Tool.get_span_attributes = get_span_attributes  # type: ignore[method-assign]


@contextmanager
def watching_body(unknown: str | None = None) -> Iterator[BodyWatch]:
    """A fresh watch for the call run inside this block (`unknown`: see `BodyWatch`)."""
    watch = BodyWatch(unknown=unknown)
    token = _watch.set(watch)
    try:
        yield watch
    finally:
        _watch.reset(token)
