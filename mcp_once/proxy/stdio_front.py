"""The proxy's stdio front: stdin and stdout read and written on the event loop, no worker threads.

Why: the SDK's `stdio_server` (what FastMCP's `run_stdio_async` serves on) reads each line through
`anyio.wrap_file` (a worker-thread hop per line) and writes each message with two more (write,
flush). On a proxy hop that is three thread hops per call on top of the wire, which is most of
what the "SDK floor" of issue 46 costs (benchmarks/README.md, "The proxy hop"). Here the same
descriptors are waited on by the event loop (`anyio.wait_readable` / `anyio.wait_writable`, on
asyncio and trio) and read and written with `os.read` / `os.write`; the rest is the SDK's
transport as it was: the same `(read_stream, write_stream)` of `SessionMessage` (context streams,
as the SDK's session expects), the same fd claim (the SDK's own `_claim_fd`: while serving, fd 0
reads the null device and fd 1 goes to stderr, so a stray print of a handler or a child misses
the wire; both restored on exit; a second stdio transport in the process is refused), a line that
is not a JSON-RPC message delivered as the exception, the input decoded as UTF-8 with
errors="replace", EOF ending the session.

Why the descriptors stay blocking: O_NONBLOCK is a flag of the open file description, which a
pipe's end shares with every process that inherited it (the client, a launcher such as `npx` or a
shell that started the proxy with its own stdin) and which a `dup` shares too: setting it would
leave the others' reads and writes failing with EAGAIN, during the run and after it (a terminal
left non-blocking). So no flag is touched. A read waits for readiness first and then takes what
is there (a read of a readable pipe, socket or terminal returns at once); a write waits for
readiness and then writes at most `select.PIPE_BUF` bytes, which a writable pipe takes whole
without blocking (POSIX: a writable pipe has room for PIPE_BUF bytes), looping over the rest
(partial writes handled). This holds while the proxy is the only reader of its stdin and the only
writer of its stdout, which the fd claim makes so within the process.

Differences from the SDK's transport: lines are split at "\\n" only (the SDK's text layer also
splits at a bare "\\r", which a JSON-RPC message never holds outside a string); a stdout that
closes under a write (the client is gone) ends the session cleanly (the rest of the answers are
dropped, stdin is no longer read) where the SDK's writer raised.

The SDK's claim and its context streams are private names of the SDK (`mcp.server.stdio`,
`mcp.shared._context_streams`): shared rather than written again, so that the claim's registry
and restore stay the SDK's; the SDK is pinned, and `tests/proxy/test_stdio_front.py` runs them.

Fallback: the SDK's `stdio_server` serves where this cannot: on Windows (no readiness for
files), where fd 0 or fd 1 is not a pipe, a socket or a terminal (a regular file or the null
device, which the event loop's selector refuses to watch), and where `sys.stdin` / `sys.stdout`
are not the process's fds 0 and 1 (replaced streams, served in place by the SDK).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TextIO

import anyio
import mcp_types
from mcp.server.stdio import (  # the SDK's fd claim, shared so one registry refuses a second
    _claim_fd,
    _is_backed_by_fd,
    _open_stdin_diversion,
    _open_stdout_diversion,
    stdio_server,
)
from mcp.shared._context_streams import (
    ContextReceiveStream,
    ContextSendStream,
    create_context_streams,
)
from mcp.shared.message import SessionMessage

from mcp_once._upstream import replay
from mcp_once._upstream.fdio import Lines, read_some, waitable, write_all

logger = logging.getLogger("mcp_once.proxy")

#: What a stdout closed under a write raises (a pipe's reader gone; a socket's peer gone).
_GONE = (BrokenPipeError, ConnectionResetError)


def servable(fd: int, stream: TextIO) -> bool:
    """Whether this transport can serve `fd`: `stream` is backed by it, and it is a pipe, a socket
    or a terminal (what the event loop's selector can wait on)."""
    return _is_backed_by_fd(stream, fd) and waitable(fd, terminal=True)


#: What the transport yields, as the SDK's `stdio_server` does: messages in (or what a line's
#: parsing raised), messages out.
Streams = tuple[ContextReceiveStream[SessionMessage | Exception], ContextSendStream[SessionMessage]]


@asynccontextmanager
async def stdio_front() -> AsyncIterator[Streams]:
    """Serve MCP over the process's stdin and stdout on the event loop (see the module's
    docstring), or through the SDK's `stdio_server` where the fds do not allow it. Yields the
    streams the SDK's `stdio_server` yields."""
    if not (servable(0, sys.stdin) and servable(1, sys.stdout)):
        logger.debug(
            "stdio front: fd 0 or 1 is not a pipe, socket or terminal; the SDK's transport"
        )
        async with stdio_server() as streams:
            yield streams
        return
    restore_stdin = restore_stdout = None
    try:
        stdin, restore_stdin = _claim_fd(0, sys.stdin, "rb", _open_stdin_diversion)
        stdout, restore_stdout = _claim_fd(1, sys.stdout, "wb", _open_stdout_diversion)
        async with _served(stdin.fileno(), stdout.fileno()) as streams:
            yield streams
    finally:
        if restore_stdout is not None:
            restore_stdout()
        if restore_stdin is not None:
            restore_stdin()


@asynccontextmanager
async def _served(in_fd: int, out_fd: int) -> AsyncIterator[Streams]:
    read_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
    write_stream, write_reader = create_context_streams[SessionMessage](0)
    reading = anyio.CancelScope()
    start = replay.current  # this start's replay (`replay.py`): its queued lines, its answers

    async def read() -> None:
        with reading:
            async with read_writer:
                await _read_lines(in_fd, read_writer, start)

    async def write() -> None:
        gone = False
        async with write_reader:
            async for message in write_reader:
                if gone:
                    continue  # the client is gone: what is left to say is dropped
                data: str | None
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                if start is not None:
                    data = start.to_caller(_answer_id(message.message), data)
                    if data is None:
                        continue  # answered from the replay file already (compared there)
                try:
                    await write_all(out_fd, (data + "\n").encode())
                except _GONE:
                    logger.debug("stdio front: stdout closed (the client is gone); ending")
                    gone = True
                    reading.cancel()
                if start is not None and start.due:
                    start.record()  # the replay file, once its answers are out (`replay.py`)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        tg.start_soon(write)
        yield read_stream, write_stream


def _answer_id(message: mcp_types.JSONRPCMessage) -> object:
    """The id of `message` if it is an answer (a result or an error), else None."""
    if isinstance(message, mcp_types.JSONRPCResponse | mcp_types.JSONRPCError):
        return message.id
    return None


async def _read_lines(
    fd: int, sink: ContextSendStream[SessionMessage | Exception], start: replay.Start | None
) -> None:
    """Deliver each line read from `fd` (a message, or the exception its parsing raised) until
    EOF; a last line without its newline is delivered at EOF, as a text file's would be. With
    `start`, the lines it read before FastMCP was imported come first, then what it read past
    them, and each line is shown to it (what it records for the next start)."""
    rest = b""
    if start is not None:
        queued, rest = start.handed_over()
        for early in queued:
            start.from_caller(early)
            await _deliver(early, sink)
    lines = Lines(functools.partial(read_some, fd), rest)
    while (line := await lines.line()) is not None:
        if start is not None:
            start.from_caller(line)
        await _deliver(line, sink)
    if start is not None:
        await start.compared()  # the replay's proof first, then the session's end


async def _deliver(line: bytes, sink: ContextSendStream[SessionMessage | Exception]) -> None:
    try:
        text = line.decode("utf-8", errors="replace")
        message = mcp_types.jsonrpc_message_adapter.validate_json(text, by_name=False)
    except Exception as exc:
        await sink.send(exc)
        return
    await sink.send(SessionMessage(message))
