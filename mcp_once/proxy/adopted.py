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

With a replay (`mcp_once._upstream.replay`), the adopted child's pipes are tapped: what the link
writes and reads until the child's first listing is shown to the replay (what the next start is
compared with), and what the replay read past its own answers is read first. When the replay
made the child's handshake already, the link's session adopts its `InitializeResult`
(`ClientSession.adopt`: the negotiated state, no wire traffic) instead of sending a second
`initialize`, which a server would refuse or answer as a new session.
"""

from __future__ import annotations

import sys
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TextIO

import mcp.client.stdio as sdk_stdio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process
from fastmcp.client.transports import StdioTransport
from mcp_types import InitializeResult

from mcp_once._upstream.early import EarlyChild, started
from mcp_once._upstream.replay import Start

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
        assert child is not None
        return process if child.replay is None else _Tapped(process, child.replay)
    return started(await _sdk_spawn(command=command, args=args, env=env, errlog=errlog, cwd=cwd))


sdk_stdio._create_platform_compatible_process = _spawn_or_adopt


class _TappedStdin(ByteSendStream):
    def __init__(self, inner: ByteSendStream, replay: Start) -> None:
        self.inner, self.replay = inner, replay

    async def send(self, item: bytes) -> None:
        self.replay.to_child(item)
        await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _TappedStdout(ByteReceiveStream):
    def __init__(self, inner: ByteReceiveStream, replay: Start) -> None:
        self.inner, self.replay = inner, replay
        self.first = replay.child_rest

    async def receive(self, max_bytes: int = 65536) -> bytes:
        data, self.first = self.first, b""
        if not data:
            data = await self.inner.receive(max_bytes)
        self.replay.from_child(data)
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Tapped:
    """The adopted child, its stdin and stdout shown to the replay; the rest is the child's (the
    SDK also reads its private `_process`, which `__getattr__` passes on)."""

    def __init__(self, process: Process, replay: Start) -> None:
        self._inner = process
        self.stdin = None if process.stdin is None else _TappedStdin(process.stdin, replay)
        self.stdout = None if process.stdout is None else _TappedStdout(process.stdout, replay)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class AdoptingTransport(StdioTransport):
    """FastMCP's stdio transport whose first connect adopts `child` (if it is still waiting and
    runs the same command line) instead of starting one."""

    def __init__(self, child: EarlyChild, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.child = child

    async def connect(self, **kwargs: Any) -> Any:
        token = _waiting.set(self.child)
        try:
            session = await super().connect(**kwargs)
        finally:
            _waiting.reset(token)
        replay = self.child.replay
        if replay is not None and replay.handshake is not None and session is not None:
            handshake, replay.handshake = replay.handshake, None
            session.adopt(InitializeResult.model_validate(handshake))
        return session
