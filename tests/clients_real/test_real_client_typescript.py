"""The TypeScript SDK's client (npm `@modelcontextprotocol/sdk` 1.32.2, `Client` with
`StdioClientTransport` or `StreamableHTTPClientTransport`) against both servers, over stdio and
streamable HTTP.

One node process (`ts_sdk_client.mjs`) keeps one SDK client for a whole setting and makes every
call of every leg through it, as an application would; the stdio server is the process that
`StdioClientTransport` spawns.

What the TypeScript SDK client can do, and so which legs run: every one.
- arguments: any JSON, nested too; request `_meta`: `callTool({name, arguments, _meta})`;
- headers: `requestInit: {headers: {"Idempotency-Key": ...}}` on the HTTP transport (fixed for
  the transport's life: a leg that changes the header reconnects). An empty value and a tab
  inside the value are sent as they are (fetch trims only the ends);
- errors: `McpError` carries the JSON-RPC code (-32602) and `data`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from real_clients_kit import (
    ARGUMENT_LEGS,
    EMPTY_HEADER_LEG,
    HEADER_LEGS,
    HERE,
    META_LEGS,
    Call,
    Caller,
    NodeClients,
    Outcome,
    Served,
    check_legs,
)

pytestmark = pytest.mark.anyio

DRIVER = HERE / "ts_sdk_client.mjs"


class TypeScriptCaller(Caller):
    """The driver process, and the connection it holds (which server, which header)."""

    def __init__(self, process: Process, served: Served, http: bool) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self.lines = BufferedByteReceiveStream(process.stdout)
        self.served = served
        self.http = http
        self.header: str | None = None

    async def command(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        await self.process.stdin.send(json.dumps(command).encode() + b"\n")
        answer: dict[str, Any] = json.loads(await self.lines.receive_until(b"\n", 1 << 22))
        return answer

    async def connect(self, header: str | None) -> None:
        command: dict[str, Any]
        if self.http:
            headers = {} if header is None else {"Idempotency-Key": header}
            command = {"op": "connect", "url": self.served.url, "headers": headers}
        else:
            program, *args = self.served.stdio_command()
            command = {"op": "connect", "command": program, "args": args}
        answer = await self.command(command)
        assert "result" in answer, answer
        self.header = header

    async def send(self, call: Call) -> Outcome:
        if call.header != self.header:
            assert self.http, "headers travel only over HTTP"
            await self.connect(call.header)
        command = {"op": "call", "name": call.tool, "arguments": call.arguments}
        answer = await self.command({**command, "meta": call.meta})
        if "result" in answer:
            return Outcome(result=answer["result"])
        return Outcome(code=answer["error"]["code"], message=answer["error"]["message"])


@asynccontextmanager
async def typescript_client(
    clients: NodeClients, served: Served, http: bool
) -> AsyncIterator[TypeScriptCaller]:
    command = [clients.node, str(DRIVER), str(clients.prefix)]
    async with await anyio.open_process(command, stderr=None) as process:
        caller = TypeScriptCaller(process, served, http)
        await caller.connect(None)
        try:
            yield caller
        finally:
            assert process.stdin is not None
            await process.stdin.aclose()
            with anyio.fail_after(30):
                await process.wait()


async def test_typescript_sdk(
    served_setting: tuple[Served, bool], node_clients: NodeClients
) -> None:
    served, http = served_setting
    legs = ARGUMENT_LEGS + META_LEGS + ([*HEADER_LEGS, EMPTY_HEADER_LEG] if http else [])
    async with typescript_client(node_clients, served, http=http) as caller:
        await check_legs(legs, caller, served)
