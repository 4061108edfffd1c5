"""The front's limits: how big a request body may be, and how many calls one caller may have in
flight.

A gateway in front of other people's servers is the first thing a careless or hostile caller
reaches: without a bound, one request body of a gigabyte is read into memory and parsed, and one
caller with a thousand concurrent calls holds every upstream slot and every lease. Both bounds are
checked before anything is claimed or stored:

- `BodyLimit` (ASGI, around the HTTP app): a body over `max_bytes` is answered 413 before a byte
  of it is parsed. A `Content-Length` over the bound is refused at once, unread; a body without
  one (chunked) is counted as it arrives and refused at the first chunk past the bound. A body
  within it is read whole and handed on: the MCP transport reads it whole anyway.
- `InFlightLimit` (FastMCP middleware, outside the guard): each principal (rule 7: client id,
  issuer, subject; without authentication, every caller is one anonymous principal) may have
  `max_in_flight` `tools/call` requests running; one more is refused -32013 with `retryAfterMs`,
  as every "nothing ran, try again later" answer of the contract is. A replay or a waiting
  duplicate holds its slot while it waits: it is a call in flight too.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any

from fastmcp.server.dependencies import get_access_token
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import ToolResult
from mcp import MCPError
from mcp.server.auth.provider import principal_components
from mcp_types import CallToolRequestParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from idempotency import wire
from mcp_once._limits import DEFAULT_MAX_BODY, DEFAULT_MAX_IN_FLIGHT

#: How long a caller refused for its calls in flight is told to wait (ms).
IN_FLIGHT_RETRY_AFTER_MS = 500


class BodyLimit:
    """ASGI middleware answering 413 to an HTTP request whose body exceeds `max_bytes`."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY) -> None:
        if max_bytes < 1:
            raise ValueError(f"the body bound must be at least 1 byte, not {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: nothing to serve
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: list[Message] = [{"type": "http.request", "body": b"".join(chunks)}]

        async def replay() -> Message:
            # The body once, as one message; then what the client sends next (a disconnect).
            return body.pop() if body else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        error = {
            "jsonrpc": "2.0",
            "id": None,
            "error": {
                "code": -32600,
                "message": f"Request body too large: the proxy takes at most {self.max_bytes}"
                " bytes; nothing was read or run.",
                "data": {"maxBytes": self.max_bytes},
            },
        }
        payload = json.dumps(error).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    # The rest of the body is not read: the connection cannot carry another
                    # request after it.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server's HTTP parser refuses it; counted as it comes here
    return None


def principal_key() -> Hashable:
    """Who the current request is, for counting: its principal's components, or None for every
    unauthenticated caller."""
    token = get_access_token()
    return None if token is None else principal_components(token)


class InFlightLimit(Middleware):
    """Refuses a principal's `tools/call` beyond `max_in_flight` running at once (-32013)."""

    def __init__(self, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        if max_in_flight < 1:
            raise ValueError(f"the in-flight bound must be at least 1, not {max_in_flight}")
        self.max_in_flight = max_in_flight
        #: Calls in flight per principal; a principal with none has no entry (a plain dict: a
        #: `Counter` answers a missing key and drops one through Python-level methods).
        self._running: dict[Hashable, int] = {}

    def in_flight(self, principal: Hashable = None) -> int:
        return self._running.get(principal, 0)

    async def on_call_tool(
        self,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        with self.admitted():
            return await call_next(context)

    def admitted(self) -> _Admitted:
        """The current principal's call counted in flight for the block (`with`), or refused
        (-32013) past the bound (the pass-through fast path counts its calls here too). A
        plain context manager, not a generator's: it is entered on every call."""
        return _Admitted(self)


class _Admitted:
    """One call counted in flight for its principal while entered (`InFlightLimit.admitted`)."""

    __slots__ = ("_limit", "_principal")

    def __init__(self, limit: InFlightLimit) -> None:
        self._limit = limit
        self._principal = principal_key()

    def __enter__(self) -> None:
        limit, principal = self._limit, self._principal
        running = limit._running.get(principal, 0)
        if running >= limit.max_in_flight:
            raise MCPError(
                wire.STORE_UNAVAILABLE,
                f"Too many calls in flight for this caller (at most {limit.max_in_flight});"
                " the tool was not run. Retry later.",
                _refusal(limit.max_in_flight),
            )
        limit._running[principal] = running + 1

    def __exit__(self, *exc_info: object) -> None:
        running, principal = self._limit._running, self._principal
        left = running[principal] - 1
        if left:
            running[principal] = left
        else:
            del running[principal]


def _refusal(bound: int) -> dict[str, Any]:
    return {"retryAfterMs": IN_FLIGHT_RETRY_AFTER_MS, "limit": "inFlight", "maxInFlight": bound}
