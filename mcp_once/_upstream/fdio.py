"""Reading and writing a pipe's descriptor on the event loop, without touching its flags.

Shared by the proxy's stdio front (`mcp_once.proxy.stdio_front`, which says why the descriptors
stay blocking and why a write gives at most `WRITE_SIZE` bytes) and the replay of its first
answers (`replay.py`), which reads the caller's first lines before FastMCP is imported: both
read and write fds 0 and 1 the same way, and ask the same of them first (`waitable`), so they
are one piece of code with anyio and the standard library only.
"""

from __future__ import annotations

import os
import select
import stat
import sys

import anyio

#: The most one read takes (a message longer than this is joined across reads).
READ_SIZE = 1 << 16
#: The most one write gives: what a writable pipe takes without blocking.
WRITE_SIZE: int = getattr(select, "PIPE_BUF", 512)  # POSIX's least; not on Windows


async def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd`, waiting for it to be writable before each part."""
    view = memoryview(data)
    while view:
        await ready(fd, readable=False)
        view = view[os.write(fd, view[:WRITE_SIZE]) :]


async def ready(fd: int, *, readable: bool) -> None:
    """Return once `fd` is readable (or writable): at once when it already is (one `select` with
    no wait, cheaper than a turn of the event loop), else when the event loop says so."""
    watched = [fd]
    if readable:
        if select.select(watched, [], [], 0)[0]:
            return
        await anyio.wait_readable(fd)
    else:
        if select.select([], watched, [], 0)[1]:
            return
        await anyio.wait_writable(fd)


def waitable(fd: int, *, terminal: bool) -> bool:
    """Whether the event loop can wait on `fd` (what `ready` does): a pipe or a socket, or, with
    `terminal`, a terminal. Never on Windows (no readiness for files there); never a regular file
    or the null device, which the event loop's selector refuses to watch."""
    if sys.platform == "win32":
        return False
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return True
    return terminal and stat.S_ISCHR(mode) and os.isatty(fd)
