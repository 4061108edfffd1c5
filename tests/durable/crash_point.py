"""The worker side of a crash test: die at a named point, once per test.

Stdlib only: worker processes of other environments (LangGraph's, with `mcp<2`) import it from
this folder too. The test (`crash_kit.run_crashing`) sets two variables in the worker's
environment: `MCP_ONCE_CRASH_WINDOW` (`before`, `during` or `after`) and `MCP_ONCE_CRASH_MARK`
(a file path). `crash_point(window)` dies with `os._exit` (no cleanup, no flush of anything the
engine holds, as SIGKILL would) the first time the named window is reached, and leaves the mark
so that the restarted worker, with the same environment, goes on. `during` is not reached by
worker code: the test SIGKILLs the worker when the server's ledger shows the tool started.
"""

from __future__ import annotations

import os

WINDOW = "MCP_ONCE_CRASH_WINDOW"
MARK = "MCP_ONCE_CRASH_MARK"
#: The exit status of a worker that died at its crash point (what SIGKILL's 128 + 9 would be).
CRASHED = 137


def crash_point(window: str) -> None:
    """Die here if this is the test's crash window and no worker has died at it yet."""
    if os.environ.get(WINDOW) != window:
        return
    mark = os.environ[MARK]
    try:
        fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.fsync(fd)
    os.close(fd)
    os._exit(CRASHED)


def crashed() -> bool:
    """Whether a worker of this test has already died at its crash point."""
    return os.path.exists(os.environ.get(MARK, ""))
