"""Reading and writing a pipe's descriptor on the event loop, without touching its flags.

Shared by the proxy's stdio front (`mcp_once.proxy.stdio_front`, which says why the descriptors
stay blocking and why a write gives at most `WRITE_SIZE` bytes) and the replay of its first
answers (`replay.py`), which reads the caller's first lines before FastMCP is imported: both
read and write fds 0 and 1 the same way, and ask the same of them first (`waitable`), so they
are one piece of code with anyio and the standard library only. `Lines` splits what they read
into lines, and the child's stdout that the replay reads too: one splitter, whose unread bytes
are handed on to whoever reads the same stream next.
"""

from __future__ import annotations

import os
import select
import stat
import sys
from collections.abc import Awaitable, Callable

import anyio

#: The most one read takes (a message longer than this is joined across reads).
READ_SIZE = 1 << 16
#: The most one write gives: what a writable pipe takes without blocking.
WRITE_SIZE: int = getattr(select, "PIPE_BUF", 512)  # POSIX's least; not on Windows

#: Where `Lines` reads from: the next bytes, `b""` at EOF (a source may raise there instead, as
#: anyio's byte streams raise `EndOfStream`: that reaches `Lines.line`'s caller).
Source = Callable[[], Awaitable[bytes]]


class Lines:
    """Lines read from `source`, split at `\\n` (not part of the line; a `\\r` before it is kept,
    which a JSON parser skips as whitespace), each line taken once.

    What was read past the lines taken is kept (`rest`): the replay reads the caller's first
    lines and the child's first answers with one of these, and whoever reads the same stream
    next (the stdio front, the upstream link) starts with its `rest`. A line longer than one
    read is kept as its parts and joined once (linear in its length), with no limit of its own.
    """

    def __init__(self, source: Source, rest: bytes = b"") -> None:
        self._source = source
        self._chunk = rest  # the last bytes read, taken up to `_at`
        self._at = 0
        self._parts: list[bytes] = []  # the start of the next line, from earlier reads
        self._eof = False

    def take(self) -> bytes | None:
        """The next line among the bytes already read; None when none is whole (nothing read)."""
        end = self._chunk.find(b"\n", self._at)
        if end < 0:
            return None
        line = self._chunk[self._at : end]
        self._at = end + 1
        if self._parts:
            self._parts.append(line)
            line = b"".join(self._parts)
            self._parts.clear()
        return line

    async def line(self, *, last: bool = True) -> bytes | None:
        """The next line, reading as needed; None at EOF. A last line without its newline is
        the last one returned if `last` (as a text file's last line is read), else it stays in
        `rest` (the replay's reads: a line is a message only once its newline came)."""
        while (line := self.take()) is None:
            if self._eof:
                if not last or not (tail := self.rest):
                    return None
                self._parts.clear()
                self._chunk, self._at = b"", 0
                return tail
            if self._at < len(self._chunk):
                self._parts.append(self._chunk[self._at :])
            self._chunk, self._at = b"", 0
            chunk = await self._source()
            self._chunk, self._eof = chunk, not chunk
        return line

    @property
    def rest(self) -> bytes:
        """What was read past the lines taken."""
        return b"".join([*self._parts, self._chunk[self._at :]])


async def read_some(fd: int) -> bytes:
    """What `fd` holds (at most `READ_SIZE` bytes), once it is readable; `b""` at EOF (a socket
    its peer reset, too). A `Source` with `functools.partial`."""
    await ready(fd, readable=True)
    try:
        return os.read(fd, READ_SIZE)
    except ConnectionResetError:
        return b""


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
