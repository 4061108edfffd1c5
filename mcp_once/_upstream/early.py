"""A stdio upstream's first child, started before the proxy imports FastMCP (issue 46, item 3).

The proxy's start-up used to be its own imports (FastMCP, the MCP SDK, pydantic: about a second)
followed by the upstream's (a Python server imports the same SDK): one after the other, though
they are two processes. `mcp-once proxy` now starts the child first, with what this module needs
only (anyio), then imports and builds the server while the child starts; the upstream link
adopts the running child for its first session (`mcp_once.proxy.adopted`), so the first
`tools/list` waits for the slower of the two, not for their sum.

The child is started exactly as the SDK's stdio transport starts one (`mcp.client.stdio`): the
same command line, environment (`child_env`), working directory and stderr (ours), in a session
of its own. A command that cannot be started is not reported here: the link starts it again the
usual way and reports it as it always has (`UpstreamStartFailed`). Windows keeps the SDK's own
spawn (a Job Object, not a process group): nothing is started early there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import anyio
from anyio.abc import Process

from .identity import CHAIN_VARIABLE, chain_marking
from .spec import Upstream

if TYPE_CHECKING:
    from .replay import Start

#: How long a child that was never adopted gets to exit once its stdin closes, before the kill.
_GRACE = 2.0


class _Child(Protocol):
    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...


_C = TypeVar("_C", bound=_Child)

#: Every stdio child this process started for its upstreams (here, and through the SDK's spawn:
#: `mcp_once.proxy.adopted`), those not known to have exited: what `stop_children` signals.
_children: list[_Child] = []


def started(process: _C) -> _C:
    """Note `process`, a child just started, for `stop_children`; `process`."""
    _children[:] = [p for p in _children if p.returncode is None]
    _children.append(process)
    return process


def stop_children(signum: int = signal.SIGTERM) -> None:
    """Send `signum` to the process group of every child started that has not exited (each runs
    in a session of its own, as the SDK starts it: a launcher such as `npx` or `uv run` and the
    server under it). Why: the proxy asked to stop by a signal stops its upstreams at once,
    instead of the SDK's stdin-then-2-s-then-SIGTERM sequence, which a desktop client's own 2 s
    before its SIGKILL of the proxy cuts short, leaving a child that ignores EOF behind."""
    if sys.platform == "win32":  # pragma: no cover - the SDK's Job Object stops them there
        return
    for process in _children:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signum)


def child_env(upstream: Upstream) -> dict[str, str]:
    """The environment of `upstream`'s child: the proxy's own (a desktop client's config sets it
    for the proxy), plus what the config entry names, marked with the chain of upstreams served
    above it (a proxy it starts finds itself there: a loop)."""
    marking = chain_marking(upstream.identity)
    return {**os.environ, **upstream.env, CHAIN_VARIABLE: marking}


class EarlyChild:
    """A started child waiting for the link to adopt it (`take`), once."""

    def __init__(self, argv: Sequence[str], process: Process) -> None:
        self.argv = list(argv)
        self._process: Process | None = process
        #: This start's replay (`replay.py`), when the child's first lines go through it: the
        #: link then reads what it read past its answers first, and adopts its handshake.
        self.replay: Start | None = None

    def take(self, argv: Sequence[str]) -> Process | None:
        """The running child, if it is the one `argv` would start and was not taken yet; the
        link's first session reads and writes its pipes from then on, and stops it."""
        if self._process is None or list(argv) != self.argv:
            return None
        process, self._process = self._process, None
        return process

    @property
    def taken(self) -> bool:
        return self._process is None

    @property
    def waiting(self) -> Process | None:
        """The child, while nothing has adopted it (the replay talks to it first)."""
        return self._process

    async def aclose(self) -> None:
        """Stop the child if nothing adopted it (the proxy stopped before its first session: bad
        input found after the start): stdin closed, as the SDK stops one, then killed."""
        process, self._process = self._process, None
        if process is None:
            return
        with anyio.CancelScope(shield=True):
            if process.stdin is not None:
                await process.stdin.aclose()
            with anyio.move_on_after(_GRACE):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()


async def start_early(upstream: Upstream) -> EarlyChild | None:
    """`upstream`'s child, started now; None for an HTTP upstream, on Windows, or when the command
    cannot be started (the link's own start reports that)."""
    if not upstream.command or sys.platform == "win32":
        return None
    argv = list(upstream.command)
    try:
        process = await anyio.open_process(
            argv,
            env=child_env(upstream),
            stderr=sys.stderr,
            cwd=upstream.cwd,
            start_new_session=True,
        )
    except (OSError, ValueError):
        return None
    return EarlyChild(argv, started(process))
