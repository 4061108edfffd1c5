"""A fault-injecting wrapper around the SDK's in-memory transport, local to these tests.

It pumps `SessionMessage`s between the client and a real in-process server and, for chosen
`tools/call` requests, loses the answer: "drop" swallows it (the client times out), "kill"
swallows it and cuts the link (the client sees "Connection closed"). Either way the tool has run
to completion on the server exactly once: the lost-ack case, made deterministic.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from mcp.client._memory import InMemoryTransport
from mcp.client._transport import TransportStreams
from mcp.server.mcpserver import MCPServer
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCRequest, JSONRPCResponse

Fault = Literal["drop", "kill"]

#: The requests a plan can fault: a `tools/call` by its tool's name, a task's poll by its method.
_PLANNED = frozenset({"tools/call", "tasks/get", "tasks/update", "tasks/cancel"})


@dataclass
class Faults:
    """A plan shared by every link a test opens (so it spans reconnections)."""

    #: Per tool name (or a task's method, `tasks/get`): faults for its successive requests
    #: (None = deliver).
    plan: dict[str, list[Fault | None]] = field(default_factory=dict)
    #: Per tool name: the fault for every request once `plan` is used up.
    always: dict[str, Fault] = field(default_factory=dict)
    #: Every tools/call request that passed, as (tool, params).
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    links: int = 0
    kills: int = 0

    def decide(self, tool: str) -> Fault | None:
        queue = self.plan.get(tool)
        if queue:
            return queue.pop(0)
        return self.always.get(tool)


@asynccontextmanager
async def faulty_transport(server: MCPServer, faults: Faults) -> AsyncIterator[TransportStreams]:
    faults.links += 1
    async with InMemoryTransport(server) as (server_read, server_write):
        up_send, up_recv = anyio.create_memory_object_stream[SessionMessage](0)
        down_send, down_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        pending: dict[Any, Fault] = {}

        async def pump_up() -> None:
            with contextlib.suppress(anyio.ClosedResourceError):  # a kill closes it under us
                async for item in up_recv:
                    message = item.message
                    if isinstance(message, JSONRPCRequest) and message.method in _PLANNED:
                        params = dict(message.params or {})
                        tool = str(params.get("name", message.method))
                        faults.requests.append((tool, params))
                        fault = faults.decide(tool)
                        if fault is not None:
                            pending[message.id] = fault
                    try:
                        await server_write.send(item)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return

        async def pump_down() -> None:
            killed = False
            async with down_send:
                async for item in server_read:
                    if killed:
                        continue  # keep draining so the server never blocks on a dead link
                    message = item.message if isinstance(item, SessionMessage) else None
                    if isinstance(message, JSONRPCResponse | JSONRPCError):
                        fault = pending.pop(message.id, None)
                        if fault == "drop":
                            continue
                        if fault == "kill":
                            killed = True
                            faults.kills += 1
                            await down_send.aclose()
                            up_recv.close()
                            continue
                    try:
                        await down_send.send(item)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        killed = True

        async with anyio.create_task_group() as tg:
            tg.start_soon(pump_up)
            tg.start_soon(pump_down)
            try:
                yield down_recv, up_send
            finally:
                up_send.close()
                down_recv.close()
                tg.cancel_scope.cancel()
