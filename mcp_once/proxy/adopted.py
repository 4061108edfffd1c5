"""The stdio transport that adopts the child `mcp-once proxy` started before its imports.

`mcp_once._upstream.early` starts the upstream's first child while FastMCP is being imported;
this hands it to FastMCP's `StdioTransport`, and through it to the SDK's `stdio_client`, as if
that had started it: the SDK's own pipe tasks, shutdown (stdin closed, then the process group
killed) and everything above them stay exactly as for a child it starts. The SDK has no seam for
a process started elsewhere, so its spawn function (`_create_platform_compatible_process`, looked
up by `stdio_client` at each call) is wrapped once, here: while an `AdoptingTransport` connects
(a context variable, seen by the connect task FastMCP creates) it returns the waiting child for
that same command line; everywhere else, and for every later child, it spawns as it always did,
noting the child (`early.started`) so that a proxy stopped by a signal stops it
(`early.stop_children`).
"""

from __future__ import annotations

import sys
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TextIO

import mcp.client.stdio as sdk_stdio
from fastmcp.client.transports import StdioTransport

from mcp_once._upstream.early import EarlyChild, started

_waiting: ContextVar[EarlyChild | None] = ContextVar("mcp_once_early_child", default=None)
_sdk_spawn = sdk_stdio._create_platform_compatible_process


async def _spawn_or_adopt(
    command: str,
    args: list[str],
    env: dict[str, str] | None = None,
    errlog: TextIO = sys.stderr,
    cwd: Path | str | None = None,
) -> Any:
    child = _waiting.get()
    process = None if child is None else child.take([command, *args])
    if process is not None:
        return process
    return started(await _sdk_spawn(command=command, args=args, env=env, errlog=errlog, cwd=cwd))


sdk_stdio._create_platform_compatible_process = _spawn_or_adopt


class AdoptingTransport(StdioTransport):
    """FastMCP's stdio transport whose first connect adopts `child` (if it is still waiting and
    runs the same command line) instead of starting one."""

    def __init__(self, child: EarlyChild, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.child = child

    async def connect(self, **kwargs: Any) -> Any:
        token = _waiting.set(self.child)
        try:
            return await super().connect(**kwargs)
        finally:
            _waiting.reset(token)
