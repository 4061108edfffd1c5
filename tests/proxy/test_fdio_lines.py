"""The one line reader of the stdio proxy's start-up path (`mcp_once._upstream.fdio.Lines`): the
caller's stdin in the replay and in the stdio front, the child's stdout in the replay. Its edge
cases on asyncio and trio: a line longer than a pipe's buffer and a read (through a real pipe),
a line split across reads (at the newline too), a last line without its newline at EOF (returned
to the front, kept for the next reader by the replay), CRLF, the bytes read past the lines taken
handed to the next reader, a wait cancelled mid-line losing nothing, and a stream's end raised
by its source reaching the caller. The front and the replay on these: `test_stdio_front.py`,
`tests/cli/test_cli_replay.py`."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

import anyio
import pytest

from mcp_once._upstream.fdio import READ_SIZE, Lines, Source, read_some, write_all

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])]


def scripted(*chunks: bytes) -> tuple[Source, list[int]]:
    """A source of `chunks`, one per read, then EOF; and the count of reads made."""
    reads = [0]
    left: Iterator[bytes] = iter(chunks)

    async def source() -> bytes:
        reads[0] += 1
        return next(left, b"")

    return source, reads


async def every(lines: Lines, *, last: bool = True) -> list[bytes]:
    found = []
    while (line := await lines.line(last=last)) is not None:
        found.append(line)
    return found


async def test_a_line_longer_than_a_pipe_and_a_read_through_a_real_pipe() -> None:
    long = bytes(range(33, 127)) * (3 * READ_SIZE // 94)  # ~3 reads, ~3 pipe buffers
    assert len(long) > 2 * READ_SIZE
    read_end, write_end = os.pipe()
    open_ends = [read_end, write_end]
    try:
        lines = Lines(functools.partial(read_some, read_end))

        async def write() -> None:
            await write_all(write_end, b"first\n" + long + b"\nlast")
            os.close(open_ends.pop())  # EOF

        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            assert await every(lines) == [b"first", long, b"last"]
    finally:
        for fd in open_ends:
            os.close(fd)


async def test_lines_split_across_reads_and_empty_lines() -> None:
    source, reads = scripted(b"ab", b"c\nd", b"\n", b"\n\ne", b"f\n")
    lines = Lines(source)
    assert await every(lines) == [b"abc", b"d", b"", b"", b"ef"]
    assert reads[0] == 6  # the last one found EOF
    assert await lines.line() is None  # EOF is not read again
    assert reads[0] == 6


async def test_a_last_line_without_its_newline() -> None:
    lines = Lines(scripted(b"one\ntw", b"o")[0])
    assert await every(lines) == [b"one", b"two"]  # the front: delivered at EOF
    assert lines.rest == b""

    lines = Lines(scripted(b"one\ntw", b"o")[0])
    assert await every(lines, last=False) == [b"one"]  # the replay: left for the front
    assert lines.rest == b"two"


async def test_crlf_keeps_the_carriage_return() -> None:
    """Split at LF only, as the old readers did; a JSON parser skips the CR as whitespace."""
    lines = Lines(scripted(b'{"a":1}\r\n{"b"', b":2}\r\n")[0])
    assert await every(lines) == [b'{"a":1}\r', b'{"b":2}\r']


async def test_what_was_read_past_the_lines_taken_is_handed_on() -> None:
    """The replay's reader takes one line of a chunk; the next reader (the front, on its own fd)
    gets the rest first, whole lines and the start of one, then reads on."""
    replayed = Lines(scripted(b"init\nnotified\nlist\nca", b"never read by the replay")[0])
    assert await replayed.line(last=False) == b"init"
    assert replayed.rest == b"notified\nlist\nca"
    source, reads = scripted(b"ll\n")
    front = Lines(source, replayed.rest)  # the front's own source, the replay's bytes
    assert await every(front) == [b"notified", b"list", b"call"]
    assert reads[0] == 2


async def test_a_wait_cancelled_mid_line_keeps_what_was_read() -> None:
    """The replay waits a bounded time for the caller's first line: a timeout in the middle of
    a line loses none of it."""
    send, receive = anyio.create_memory_object_stream[bytes](10)
    lines = Lines(receive.receive)
    await send.send(b"half a ")
    with anyio.move_on_after(0.05) as waited:
        await lines.line(last=False)
    assert waited.cancelled_caught
    assert lines.rest == b"half a "
    await send.send(b"line\nnext")
    assert await lines.line(last=False) == b"half a line"
    assert lines.rest == b"next"


async def test_the_end_a_source_raises_reaches_the_caller() -> None:
    """anyio's byte streams (the child's stdout) raise at their end instead of giving b""."""
    send, receive = anyio.create_memory_object_stream[bytes](10)
    lines = Lines(receive.receive)
    await send.send(b"answer\npartial")
    await send.aclose()
    assert await lines.line(last=False) == b"answer"
    with pytest.raises(anyio.EndOfStream):
        await lines.line(last=False)
    assert lines.rest == b"partial"
