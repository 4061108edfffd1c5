"""`mcp_once.proxy.pooled`: an SSE answer closed after its reply event gives its connection back
to the pool when the server ends the stream, and is closed within the bound when it does not.
A raw loopback HTTP/1.1 server counts the connections (what the client cannot fake)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx2
import pytest
from anyio.abc import SocketStream
from loopback import serving

from mcp_once.proxy.pooled import DRAIN_SECONDS, DrainingTransport

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

EVENT = b"event: message\r\ndata: {}\r\n\r\n"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class SseServer:
    """Answers every request with one SSE event, then (if `ends`) the body's end after a pause
    (the client has read the event and closed by then), else holds the stream open."""

    def __init__(self, *, ends: bool) -> None:
        self.ends = ends
        self.accepted = 0
        self.gone = anyio.Event()

    async def _serve(self, stream: SocketStream) -> None:
        self.accepted += 1
        async with stream:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    try:
                        buffer += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        self.gone.set()
                        return
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length")), 0,
                )  # fmt: skip
                while len(buffer) < length:
                    buffer += await stream.receive()
                buffer = buffer[length:]
                await stream.send(HEAD + chunk(EVENT))
                if not self.ends:
                    continue
                await anyio.sleep(0.05)  # the body's end comes after the client closed early
                await stream.send(b"0\r\n\r\n")

    @asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        async with serving(self._serve) as port:
            yield f"http://127.0.0.1:{port}/mcp"


async def post_and_close_early(client: httpx2.AsyncClient, url: str) -> None:
    """What the SDK does: read the first event, close the response."""
    async with client.stream("POST", url, content=b"{}") as response:
        async for _ in response.aiter_bytes():
            break
        await response.aclose()


@pytest.mark.parametrize("transport", [DrainingTransport, httpx2.AsyncHTTPTransport])
async def test_an_ended_sse_answer_closed_early_keeps_its_connection(
    transport: type[httpx2.AsyncBaseTransport],
) -> None:
    """Five early-closed answers: one connection with the drain, five without (what it fixes)."""
    server = SseServer(ends=True)
    async with server.running() as url, httpx2.AsyncClient(transport=transport()) as client:
        for _ in range(5):
            await post_and_close_early(client, url)
    assert server.accepted == (1 if transport is DrainingTransport else 5)


async def test_an_sse_answer_held_open_is_closed_within_the_bound() -> None:
    """A server that never ends the stream: the close gives up after DRAIN_SECONDS and the
    connection is dropped (the server sees it go), as it was without the drain."""
    server = SseServer(ends=False)
    async with server.running() as url, httpx2.AsyncClient(transport=DrainingTransport()) as client:
        began = anyio.current_time()
        with anyio.fail_after(DRAIN_SECONDS + 5):
            await post_and_close_early(client, url)
            await server.gone.wait()
        assert anyio.current_time() - began >= DRAIN_SECONDS
        await post_and_close_early(client, url)
    assert server.accepted == 2
