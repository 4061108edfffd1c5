"""Streamable HTTP, seen by the retry logic: the status, Retry-After, and "never sent".

The SDK turns an HTTP error without a JSON-RPC body into a bare `MCPError(-32603)`, losing the
status and `Retry-After`; and a transport error (connection refused, reset) escapes the transport's
task group, which cancels whoever runs inside `async with Client(...)` — indistinguishable there
from a real cancellation. `RetryAwareTransport` sits under httpx2 and fixes both: it records what
happened to each `tools/call` attempt on that attempt's probe, and hands the SDK a stand-in
response for a transport error so it stays inside the call as an ordinary failure.

The stand-in is only the SDK's to see. What the caller sees is the failure itself, as a
`TransportFailed` naming the URL (credentials redacted) and what went wrong (refused, no such
host, TLS, timeout), chained to httpx2's exception: a user whose server is not up must read
"connection refused", not a JSON-RPC -32603 or an HTTP 503 that no server sent. The classifier
puts it in place of the SDK's stand-in error, and a connect factory's failure is found the same
way (`ConnectWatch`), since `initialize` is no `tools/call` a probe could match.

The probe reaches the transport through a context variable: the SDK runs each request's POST with
the contextvars of the task that sent the message. The probe is matched against the request body
(key and attempt) so no other request can write to it.
"""

from __future__ import annotations

import contextvars
import email.utils
import json
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from socket import gaierror as socket_gaierror
from typing import Any

import httpx2
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client

from idempotency import wire

#: Header on the stand-in response the SDK gets in place of a transport error.
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


def redacted_url(url: object) -> str:
    """`url` without its password, for messages and logs (a URL may carry credentials)."""
    parsed = httpx2.URL(str(url))
    if not parsed.userinfo:
        return str(parsed)
    user = parsed.username
    return str(parsed.copy_with(username=user or None, password="***" if parsed.password else None))


def _causes(error: BaseException) -> list[BaseException]:
    """`error` and everything it was raised from or during, exception groups opened."""
    seen: list[BaseException] = []
    pending = [error]
    while pending:
        current = pending.pop(0)
        if any(current is known for known in seen):
            continue
        seen.append(current)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)
    return seen


def _what_failed(error: httpx2.TransportError) -> str:
    """What an operator would call the failure: the root cause, not httpx2's summary of it."""
    causes = _causes(error)
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return "connection refused"
    if any(isinstance(c, socket_gaierror) for c in causes):
        return "the host name does not resolve"
    if any(isinstance(c, ssl.SSLError) for c in causes):
        return "the TLS handshake failed"
    if isinstance(error, httpx2.ConnectTimeout):
        return "timed out connecting"
    if isinstance(error, httpx2.PoolTimeout):
        return "timed out waiting for a free connection"
    if isinstance(error, httpx2.TimeoutException):
        return "timed out waiting for the server"
    if isinstance(error, httpx2.ConnectError):
        return "could not connect"
    if isinstance(error, httpx2.RemoteProtocolError):
        return "the server closed the connection"
    return "the connection failed"


def _root_detail(error: httpx2.TransportError) -> str:
    """httpx2's own words and, where it summarised them away, the OS's."""
    detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    deepest = _causes(error)[-1]
    if deepest is not error and str(deepest) and str(deepest) not in detail:
        detail += f"; {type(deepest).__name__}: {deepest}"
    return detail


class TransportFailed(Exception):
    """A request got no answer from the server at the HTTP layer: refused, no such host, TLS,
    timed out, cut off. Raised from httpx2's exception (its `__cause__`).

    `url` is the request's URL with any password redacted; `sent` is False when no byte of the
    request can have left this process (the tool cannot have run), True when it may have.
    `RetryingSession` reports it as the last error of the `NotExecuted` or `OutcomeUnknown` that
    ends the call (message and chain), never as a JSON-RPC or HTTP error no server sent.
    """

    def __init__(self, what: str, url: str, *, sent: bool, detail: str) -> None:
        self.what = what
        self.url = url
        self.sent = sent
        super().__init__(f"{what}: {url} ({detail})")

    @classmethod
    def of(cls, error: httpx2.TransportError, url: object) -> TransportFailed:
        failed = cls(
            _what_failed(error),
            redacted_url(url),
            sent=not isinstance(error, _NOT_SENT_ERRORS),
            detail=_root_detail(error),
        )
        failed.__cause__ = error
        return failed


def transport_failure(error: BaseException) -> TransportFailed | None:
    """The transport failure behind `error` (a `TransportFailed`, or one made from an httpx2
    error found in its chain or exception groups), or None if there is none. For a connect
    factory built on the SDK's own transport, whose failures arrive as exception groups."""
    for cause in _causes(error):
        if isinstance(cause, TransportFailed):
            return cause
    for cause in _causes(error):
        if isinstance(cause, httpx2.TransportError):
            try:
                url: object = cause.request.url
            except RuntimeError:  # an error raised without its request
                url = "(unknown URL)"
            return TransportFailed.of(cause, url)
    return None


@dataclass
class ConnectWatch:
    """The first transport failure of a connect factory's requests (`initialize` and its kin),
    set in the task that enters the factory's context manager (the SDK sends each request with
    the contextvars of the task that sent it)."""

    failure: TransportFailed | None = None


current_connect: contextvars.ContextVar[ConnectWatch | None] = contextvars.ContextVar(
    "mcp_once_connect_watch", default=None
)


@dataclass
class AttemptProbe:
    """What the HTTP layer saw for one attempt of one call."""

    key: str
    attempt: int
    status: int | None = None
    retry_after: float | None = None
    #: The transport failure that stood in for an answer, if there was one.
    failure: TransportFailed | None = None
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
            # transport task group and cancel the caller instead of failing the request. The SDK
            # gets a stand-in response (any status >= 400 fails the request); the failure itself
            # goes where the caller's error is made: the attempt's probe, or the connect watch.
            failure = TransportFailed.of(exc, request.url)
            if probe is not None:
                probe.failure = failure
                probe.sent = failure.sent
            watch = current_connect.get()
            if watch is not None and watch.failure is None:
                watch.failure = failure
            return httpx2.Response(
                503,
                headers={TRANSPORT_ERROR_HEADER: type(exc).__name__},
                request=request,
                # What httpx2's request log prints: no server answered, so no server's 503.
                extensions={
                    "http_version": b"(no response)",
                    "reason_phrase": f"stand-in for {failure.what}".encode(),
                },
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
