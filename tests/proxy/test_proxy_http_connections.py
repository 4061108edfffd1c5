"""The link to an HTTP upstream keeps its TCP connections across calls (issue 46): N calls
through the proxy, from a caller of either protocol era, open no connection per call. The
connections are counted by a TCP relay in front of the upstream (the upstream, a real process,
cannot be asked). The SDK's streamable HTTP client closes an SSE answer's response as soon as its
reply event is read, before the stream's end, and httpx then discards the connection instead of
pooling it (python-sdk#2707/#2712/#3281): one new connection per call.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

import anyio
import pytest
from anyio.abc import SocketStream
from fastmcp import Client
from loopback import serving

from idempotency import open_store
from mcp_once.proxy import Upstream, build_proxy
from mcp_once.scenarios import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

CALLS = 20


class Relay:
    """A loopback TCP relay to `port` that counts the connections it accepts."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.accepted = 0

    async def _pipe(self, source: SocketStream, sink: SocketStream) -> None:
        try:
            async for chunk in source:
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            await sink.aclose()

    async def _serve(self, client: SocketStream) -> None:
        self.accepted += 1
        upstream = await anyio.connect_tcp("127.0.0.1", self.port)
        async with client, upstream, anyio.create_task_group() as tg:
            tg.start_soon(self._pipe, client, upstream)
            tg.start_soon(self._pipe, upstream, client)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        async with serving(self._serve) as port:
            yield f"http://127.0.0.1:{port}/mcp"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_calls_to_an_http_upstream_reuse_the_links_connections(
    mode: Literal["legacy", "auto"],
) -> None:
    """A pass-through read and a keyed write, CALLS each, from a 2025-era caller ("legacy") and
    a 2026-07-28 one ("auto"): the proxy opens the same few connections (the session's set-up
    and the listing's) as for one call, not one more per call."""
    upstream = ServerProcess(
        lambda port: [sys.executable, "-m", "benchmarks._hop_upstream", "--port", str(port)]
    )
    await anyio.to_thread.run_sync(upstream.start)
    try:
        relay = Relay(upstream.port)
        async with relay.running() as url:
            proxy = build_proxy(Upstream.http(url), open_store("memory://"))
            async with proxy.opened(), Client(proxy, mode=mode) as client:
                await client.call_tool_mcp("read", {"text": "warm"})
                await client.call_tool_mcp("write", {"text": "warm"})
                before = relay.accepted
                for n in range(CALLS):
                    await client.call_tool_mcp("read", {"text": f"r{n}"})
                    await client.call_tool_mcp("write", {"text": f"w{n}"})
                opened = relay.accepted - before
    finally:
        upstream.kill()
    assert opened <= 1, f"{opened} new upstream connections for {2 * CALLS} calls ({mode})"
