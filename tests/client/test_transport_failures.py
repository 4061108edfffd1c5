"""A server nobody can reach ends a call as what happened: `NotExecuted` naming the URL (its
password redacted) and the failure (refused, no such host, TLS), with the transport failure in
its chain, never a JSON-RPC -32603 or an HTTP 503 no server sent; the same exception with or
without a `Run`, a key source, or the SDK's own transport under the connect factory."""

from __future__ import annotations

import logging
import socket
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Literal

import httpx2
import pytest
from _http_server import HttpServer, free_port
from mcp import Client, MCPError, StdioServerParameters

from idempotency import wire
from orchestrator import (
    MemoryJournal,
    NotExecuted,
    ReconnectFailed,
    RetryingSession,
    RetryPolicy,
    Run,
    TransportFailed,
    streamable_http_transport,
)
from orchestrator._http import _causes, redacted_url
from orchestrator._key import adapter_key

pytestmark = pytest.mark.anyio
both_backends = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])

Variant = Literal["plain", "run", "key_source", "adapter", "sdk_transport"]
VARIANTS: tuple[Variant, ...] = ("plain", "run", "key_source", "adapter", "sdk_transport")
PASSWORD = "hunter2"


def _chain(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


async def _call(url: str, variant: Variant) -> NotExecuted:
    """One call through a RetryingSession connecting to `url`, which must fail to connect."""

    def connect() -> AbstractAsyncContextManager[Client]:
        if variant == "sdk_transport":
            return Client(url)
        return Client(streamable_http_transport(url))

    policy = RetryPolicy(max_attempts=2, connect_timeout=20.0)
    key_source = (lambda request: "source-key-1") if variant == "key_source" else None
    with pytest.raises(NotExecuted) as caught:
        if variant == "run":
            async with (
                Run("run-1", journal=MemoryJournal()) as run,
                RetryingSession(connect=connect, policy=policy, run=run) as rs,
            ):
                await rs.call_tool("plain", {"x": 1})
        elif variant == "adapter":  # as a framework adapter places its key
            async with RetryingSession(connect=connect, policy=policy) as rs:
                with adapter_key("adapter-key-1"):
                    await rs.call_tool("plain", {"x": 1}, meta={wire.KEY_META: "adapter-key-1"})
        else:
            async with RetryingSession(connect=connect, policy=policy, key_source=key_source) as rs:
                await rs.call_tool("plain", {"x": 1})
    return caught.value


def _check(error: NotExecuted, shown_url: str, what: str) -> TransportFailed:
    message = str(error)
    assert shown_url in message and what in message, message
    assert PASSWORD not in message
    assert error.attempts == 2 and error.reason == "attempts"
    assert error.report is not None
    assert {a.failure for a in error.report.attempts} == {"never_sent"}
    assert {a.http_status for a in error.report.attempts} == {None}
    chain = _chain(error)
    assert not any(isinstance(e, MCPError) for e in chain), chain
    assert isinstance(error.last_error, ReconnectFailed)
    failed = next(e for e in chain if isinstance(e, TransportFailed))
    assert failed.url == shown_url and failed.what == what and failed.sent is False
    assert any(isinstance(e, httpx2.TransportError) for e in chain)
    return failed


@both_backends
@pytest.mark.parametrize("variant", VARIANTS)
async def test_a_refused_connection_names_the_url_and_the_refusal(variant: Variant) -> None:
    port = free_port()  # bound and closed again: nobody listens there
    url = f"http://operator:{PASSWORD}@127.0.0.1:{port}/mcp"
    error = await _call(url, variant)
    failed = _check(error, f"http://operator:***@127.0.0.1:{port}/mcp", "connection refused")
    assert isinstance(failed.__cause__, httpx2.ConnectError)
    assert any(isinstance(e, ConnectionRefusedError) for e in _causes(failed))


@both_backends
@pytest.mark.parametrize("variant", VARIANTS)
async def test_a_name_that_does_not_resolve_says_so(variant: Variant) -> None:
    # `.invalid` never resolves (RFC 6761): no network is needed to see the failure.
    url = "http://mcp-once-nowhere.invalid:8000/mcp"
    error = await _call(url, variant)
    failed = _check(error, url, "the host name does not resolve")
    assert any(isinstance(e, socket.gaierror) for e in _causes(failed))


@both_backends
@pytest.mark.parametrize("variant", VARIANTS)
async def test_tls_to_a_plain_http_server_is_a_tls_failure(
    http: HttpServer, variant: Variant
) -> None:
    url = f"https://127.0.0.1:{http.port}/mcp"  # the server speaks plain HTTP
    error = await _call(url, variant)
    _check(error, url, "the TLS handshake failed")


def test_redaction_keeps_the_user_and_hides_the_password() -> None:
    assert redacted_url("http://u:p@h:1/mcp") == "http://u:***@h:1/mcp"
    assert redacted_url("http://:p@h/mcp") == "http://:***@h/mcp"
    assert redacted_url("http://u@h/mcp") == "http://u@h/mcp"
    assert redacted_url("http://h/mcp?x=1") == "http://h/mcp?x=1"


async def test_the_http_log_does_not_report_a_status_no_server_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="httpx2")
    await _call(f"http://127.0.0.1:{free_port()}/mcp", "plain")
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("httpx2")]
    assert logged and all("Service Unavailable" not in line for line in logged), logged
    assert all("(no response) 503 stand-in for connection refused" in line for line in logged)


@both_backends
async def test_a_server_that_never_answers_is_a_timeout() -> None:
    # A socket that listens but never reads: connections complete (the kernel's backlog) and
    # the request goes out, but no answer ever comes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/mcp"

        def connect() -> AbstractAsyncContextManager[Client]:
            return Client(streamable_http_transport(url, timeout=httpx2.Timeout(0.5)))

        policy = RetryPolicy(max_attempts=2, connect_timeout=20.0)
        with pytest.raises(NotExecuted) as caught:
            async with RetryingSession(connect=connect, policy=policy) as rs:
                await rs.call_tool("plain", {"x": 1})
    error = caught.value
    assert f"timed out waiting for the server: {url}" in str(error)
    failed = next(e for e in _chain(error) if isinstance(e, TransportFailed))
    assert failed.sent is True and isinstance(failed.__cause__, httpx2.ReadTimeout)
    assert not any(isinstance(e, MCPError) for e in _chain(error))


async def test_a_stdio_server_that_cannot_start_is_named_by_what_failed(tmp_path: Path) -> None:
    # The README's client with no server.py beside it: the child exits at once.
    missing = StdioServerParameters(command=sys.executable, args=[str(tmp_path / "server.py")])
    policy = RetryPolicy(max_attempts=2, connect_timeout=60.0)
    with pytest.raises(NotExecuted) as caught:
        async with RetryingSession(connect=lambda: Client(missing), policy=policy) as rs:
            await rs.call_tool("charge", {"order_id": "o-1", "cents": 500})
    message = str(caught.value)
    assert "could not open a new session: MCPError: Connection closed" in message
    assert "TaskGroup" not in message
