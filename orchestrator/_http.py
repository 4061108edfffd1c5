"""Streamable HTTP, seen by the retry logic: the status, Retry-After, and "never sent".

The SDK turns an HTTP error without a JSON-RPC body into a bare `MCPError(-32603)`, losing the
status and `Retry-After`; and a transport error (connection refused, reset) escapes the transport's
task group, which cancels whoever runs inside `async with Client(...)` — indistinguishable there
from a real cancellation. `RetryAwareTransport` sits under httpx2 and fixes both: it records what
happened to each `tools/call` attempt on that attempt's probe, and turns a transport error into a
synthetic 503 so it stays inside the call as an ordinary failure.

The probe reaches the transport through a context variable: the SDK runs each request's POST with
the contextvars of the task that sent the message. The probe is matched against the request body
(key and attempt) so no other request can write to it.
"""

from __future__ import annotations

import contextvars
import email.utils
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client

from idempotency import wire

#: Header on the synthetic 503 that stands in for a transport error.
TRANSPORT_ERROR_HEADER = "x-mcp-once-transport-error"

# Errors raised before a connection exists: no byte of the request left this process.
_NOT_SENT_ERRORS: tuple[type[httpx2.TransportError], ...] = (
    httpx2.ConnectError,
    httpx2.ConnectTimeout,
    httpx2.PoolTimeout,
    httpx2.UnsupportedProtocol,
)

# Matches mcp.shared._httpx_utils: the SDK's defaults for MCP HTTP clients.
_DEFAULT_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


@dataclass
class AttemptProbe:
    """What the HTTP layer saw for one attempt of one call."""

    key: str
    attempt: int
    status: int | None = None
    retry_after: float | None = None
    transport_error: str | None = None
    #: False only when the request provably never left this process.
    sent: bool | None = None

    def matches(self, body: bytes) -> bool:
        try:
            message = json.loads(body)
        except ValueError:
            return False
        if not isinstance(message, dict) or message.get("method") != "tools/call":
            return False
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        return (
            isinstance(meta, dict)
            and meta.get(wire.KEY_META) == self.key
            and meta.get(wire.ATTEMPT_META) == self.attempt
        )


current_probe: contextvars.ContextVar[AttemptProbe | None] = contextvars.ContextVar(
    "mcp_once_attempt_probe", default=None
)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date), or None if unusable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def _probe_for(request: httpx2.Request) -> AttemptProbe | None:
    probe = current_probe.get()
    if probe is None or request.method != "POST":
        return None
    try:
        body = request.content
    except httpx2.RequestNotRead:
        return None
    return probe if probe.matches(body) else None


class RetryAwareTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport that reports HTTP outcomes to the retry logic.

    Wraps `inner` (by default a plain `httpx2.AsyncHTTPTransport`). Plug it into the client you
    give `streamable_http_client(url, http_client=...)`, or use `http_client_factory()` /
    `streamable_http_transport()` which do that for you.
    """

    def __init__(self, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self._inner = inner if inner is not None else httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        probe = _probe_for(request)
        try:
            response = await self._inner.handle_async_request(request)
        except httpx2.TransportError as exc:
            # Keep the failure inside the call: a raised TransportError would take down the SDK's
            # transport task group and cancel the caller instead of failing the request.
            if probe is not None:
                probe.transport_error = type(exc).__name__
                probe.sent = not isinstance(exc, _NOT_SENT_ERRORS)
                probe.status = 503
            return httpx2.Response(
                503,
                headers={TRANSPORT_ERROR_HEADER: type(exc).__name__},
                request=request,
            )
        if probe is not None and response.status_code >= 400:
            probe.status = response.status_code
            probe.sent = True
            probe.retry_after = parse_retry_after(response.headers.get("retry-after"))
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def http_client_factory(
    headers: dict[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
    *,
    inner: httpx2.AsyncBaseTransport | None = None,
) -> httpx2.AsyncClient:
    """An `httpx2.AsyncClient` like the SDK's default one, on a `RetryAwareTransport`.

    The caller owns the client (`async with` it) and passes it to
    `streamable_http_client(url, http_client=...)`.
    """
    kwargs: dict[str, Any] = {
        "timeout": timeout if timeout is not None else _DEFAULT_TIMEOUT,
        "transport": RetryAwareTransport(inner),
    }
    if headers is not None:
        kwargs["headers"] = headers
    if auth is not None:
        kwargs["auth"] = auth
    return httpx2.AsyncClient(**kwargs)


@asynccontextmanager
async def streamable_http_transport(
    url: str,
    *,
    headers: dict[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
    inner: httpx2.AsyncBaseTransport | None = None,
) -> AsyncIterator[TransportStreams]:
    """Streamable HTTP on a retry-aware client it owns.

    Use it wherever a transport goes: `Client(streamable_http_transport(url))`.
    """
    async with (
        http_client_factory(headers, timeout, auth, inner=inner) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams
