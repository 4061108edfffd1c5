"""An in-memory wire to an in-process server, so in-process tests have a link to break.

`mcp.client.Client(server)` talks to an in-process server by direct dispatch in the modern era
(no streams, no JSON-RPC framing), which leaves nothing to inject faults into. The SDK's
`InMemoryTransport` (used by `Client(server, mode="legacy")`) runs `Server.run` over memory
streams, and `Server.run` serves both eras: the client's first request decides (an `initialize`
opens a legacy connection, an enveloped `server/discover` a modern one). So
`Client(in_memory_transport(server))` speaks 2026-07-28 and
`Client(in_memory_transport(server), mode="legacy")` speaks 2025-11-25, both over a real wire.
The class lives in a private SDK module; this is the one place that imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp.client._memory import InMemoryTransport
from mcp.server import Server
from mcp.server.mcpserver import MCPServer

if TYPE_CHECKING:
    from mcp.client._transport import Transport

__all__ = ["in_memory_transport"]


def in_memory_transport(
    server: Server[Any] | MCPServer, *, raise_exceptions: bool = False
) -> Transport:
    """A single-use stream transport to `server`, running it in the caller's task group on entry."""
    if not isinstance(server, Server | MCPServer):
        raise TypeError(
            f"in_memory_transport() takes a Server or MCPServer, got {type(server).__name__}"
        )
    return InMemoryTransport(server, raise_exceptions=raise_exceptions)
