"""The fast path (`mcp_once/proxy/fast_path.py`), held to what FastMCP's path did: a call the
proxy does not guard reaches the upstream once, as it came, and answers as it answered, without
FastMCP's tool run; a guarded call goes through the guard without FastMCP's dispatch and keeps
the contract on both paths (one effect per key, the replay marker, -32011, -32012 when the
upstream dies mid-call); a middleware a user adds afterwards sees every call again (FastMCP's
path); a guarded call asks FastMCP for its tool once, not once per layer. Stdio upstreams with
an effect ledger (`changing_server.py`, the TypeScript ledger server, that one over streamable
HTTP too for an HTTP upstream), the proxy in this process (the slow tier: each test starts the
upstream as a child)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import pytest
from fastmcp import Client, FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp import MCPError
from mcp.server.session import ServerSession
from mcp_types import INVALID_PARAMS, CallToolRequestParams
from opentelemetry.trace import ProxyTracerProvider
from otel_spans import recorder
from proxy_kit import (
    HERE,
    MARKER,
    InProcess,
    NodeServers,
    conformance_fixture,
    lines,
    meta_key,
    status,
    text,
)

from idempotency import MemoryKeyStore, wire
from mcp_once.proxy import (
    OnceProxy,
    ProxyPolicy,
    Upstream,
    build_proxy,
    fast_path,
    parse_policy,
)
from mcp_once.proxy.policy import ToolRule
from mcp_once.proxy.pooled import DrainingTransport
from mcp_once.proxy.tools import UPSTREAM_KEY_PREFIX, OnceProxyTool
from mcp_once.proxy.upstream import UpstreamLink
from mcp_once.scenarios import ServerProcess

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]


@asynccontextmanager
async def _proxy(ledger: Path) -> AsyncIterator[tuple[OnceProxy, Client[Any]]]:
    upstream = Upstream.stdio(sys.executable, str(HERE / "changing_server.py"), str(ledger))
    proxy = build_proxy(upstream, MemoryKeyStore())
    async with proxy.opened(), Client(proxy) as client:
        # `write` read-only from now on: its calls pass through.
        await client.call_tool(
            "turn_read_only", {}, meta={"io.github.mcp-once/idempotency-key": "k"}
        )
        await client.list_tools()
        yield proxy, client


@asynccontextmanager
async def _guarding(
    ledger: Path, server: str = "changing_server.py", policy: ProxyPolicy | None = None
) -> AsyncIterator[Client[Any]]:
    """A client of a proxy (memory store, `policy`) in front of the stdio upstream `server`
    (a script here) with its effect ledger, its tools listed."""
    upstream = Upstream.stdio(sys.executable, str(HERE / server), str(ledger))
    proxy = build_proxy(upstream, MemoryKeyStore(), policy=policy)
    async with proxy.opened(), Client(proxy) as client:
        await client.list_tools()
        yield client


@asynccontextmanager
async def _legacy_caller_of(
    command: Callable[[int], list[str]], path: str
) -> AsyncIterator[tuple[ServerProcess, Client[Any]]]:
    """A handshake-era client of a proxy (memory store) in front of the HTTP upstream that
    `command(port)` starts, the calls on the fast path or, with a middleware added, FastMCP's."""
    upstream = ServerProcess(command)
    await anyio.to_thread.run_sync(upstream.start)
    try:
        proxy = build_proxy(Upstream.http(upstream.url), MemoryKeyStore())
        if path == "fastmcp":
            proxy.add_middleware(Middleware())
        async with proxy.opened(), Client(proxy, mode="legacy") as client:
            yield upstream, client
    finally:
        upstream.kill()


def _spy(
    monkeypatch: pytest.MonkeyPatch,
    owner: type,
    method: str,
    seen: Callable[[Any, dict[str, Any]], Any],
) -> list[Any]:
    """`seen(self, keyword arguments)` of each call of `owner.method` from now on."""
    calls: list[Any] = []
    original = getattr(owner, method)

    async def spied(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(seen(self, kwargs))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(owner, method, spied)
    return calls


def _upstream_statuses(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The method and HTTP status of each request the link sends the upstream from now on,
    read off the link's own transport (`pooled.DrainingTransport`): what the upstream answered,
    not what the link made of it."""
    statuses: list[tuple[str, int]] = []
    original = DrainingTransport.handle_async_request

    async def spied(self: DrainingTransport, request: httpx2.Request) -> httpx2.Response:
        response = await original(self, request)
        statuses.append((request.method, response.status_code))
        return response

    monkeypatch.setattr(DrainingTransport, "handle_async_request", spied)
    return statuses


def _count_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the proxied tools FastMCP runs from now on."""
    return _spy(monkeypatch, OnceProxyTool, "run", lambda tool, _: tool.name)


async def test_a_pass_through_call_goes_upstream_once_without_fastmcp_s_run(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "effects"
    async with _proxy(ledger) as (_, client):
        runs = _count_runs(monkeypatch)
        result = await client.call_tool("write", {"text": "once"})
        assert runs == [], "a pass-through call took FastMCP's path"
        assert lines(ledger) == 1
        assert result.content[0].text == "wrote once"  # type: ignore[union-attr]
        assert result.structured_content == {"result": "wrote once"}
        assert MARKER not in (result.meta or {})  # passed through: nothing stored, no marker


async def test_a_middleware_added_after_the_build_sees_every_call(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []

    class Watch(Middleware):
        async def on_call_tool(
            self, context: MiddlewareContext[CallToolRequestParams], call_next: CallNext[Any, Any]
        ) -> Any:
            seen.append(context.message.name)
            return await call_next(context)

    ledger = tmp_path / "effects"
    async with _proxy(ledger) as (proxy, client):
        proxy.add_middleware(Watch())
        runs = _count_runs(monkeypatch)
        await client.call_tool("write", {"text": "watched"})
        assert seen == ["write"] and runs == ["write"]
        assert lines(ledger) == 1


async def test_a_guarded_call_looks_its_tool_up_once(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy's guard choice, the guard's own lookup and FastMCP's run each ask for the tool;
    FastMCP's lookup (every provider, every visibility transform) runs once for all three."""
    looked_up: list[str] = []
    original = FastMCP.get_tool

    async def get_tool(self: FastMCP[Any], name: str, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(name)
        return await original(self, name, *args, **kwargs)

    upstream = Upstream.stdio(
        sys.executable, str(HERE / "changing_server.py"), str(tmp_path / "effects")
    )
    proxy = build_proxy(upstream, MemoryKeyStore())
    async with proxy.opened(), Client(proxy) as client:
        await client.list_tools()
        monkeypatch.setattr(FastMCP, "get_tool", get_tool)
        result = await client.call_tool(
            "write", {"text": "guarded"}, meta={"io.github.mcp-once/idempotency-key": "k1"}
        )
        assert (result.meta or {})[MARKER]["status"] == "executed"
        assert looked_up == ["write"]


def _dispatches(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each `FastMCP.call_tool` from now on, whether it ran FastMCP's middleware chain
    (FastMCP's `tools/call` path) or only its core (the fast path's tool run)."""
    return _spy(monkeypatch, FastMCP, "call_tool", lambda _, kw: kw.get("run_middleware", True))


async def test_a_guarded_call_takes_the_fast_path(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed call of a guarded tool goes through the guard and FastMCP's core only: no
    FastMCP `tools/call` dispatch, its middleware chain or extension interceptors."""
    ledger = tmp_path / "effects"
    async with _guarding(ledger) as client:
        dispatched = _dispatches(monkeypatch)
        runs = _count_runs(monkeypatch)
        result = await client.call_tool("write", {"text": "fast"}, meta=meta_key("f1"))
        assert (result.meta or {})[MARKER]["status"] == "executed"
        assert dispatched == [], "a guarded call took FastMCP's tools/call dispatch or run"
        assert runs == [], "a guarded call took the link's typed call (`OnceProxyTool.run`)"
        assert lines(ledger) == 1
        assert result.structured_content == {"result": "wrote fast"}
        again = await client.call_tool("write", {"text": "fast"}, meta=meta_key("f1"))
        assert (again.meta or {})[MARKER]["status"] == "replayed"
        assert again.content == result.content
        assert dispatched == [] and runs == [] and lines(ledger) == 1


async def _charged_once_then_lost(client: Any, ledger: Path) -> None:
    """Through `client` (of a proxy in front of the ledger server at `ledger`): `order-1`
    charged once across a re-send (the replay marker; the upstream got the record's own key,
    rule 18, never the caller's; -32011 for the key with other arguments), then `order-2` lost:
    the upstream dies mid-call, -32012 on the call and on its re-send (UNKNOWN, never re-run)."""
    first = await client.call_tool("charge", {"amount": 5}, meta=meta_key("order-1"))
    again = await client.call_tool("charge", {"amount": 5}, meta=meta_key("order-1"))
    assert (status(first), status(again)) == ("executed", "replayed")
    assert text(again) == text(first) == "charged 5 (#1)"
    assert lines(ledger / "calls") == 1 and lines(ledger / "effects") == 1
    sent = json.loads((ledger / "calls").read_text().splitlines()[0])["key"]
    assert sent.startswith(UPSTREAM_KEY_PREFIX) and "order-1" not in sent
    with pytest.raises(MCPError) as reused:
        await client.call_tool("charge", {"amount": 6}, meta=meta_key("order-1"))
    assert reused.value.code == wire.KEY_REUSED and lines(ledger / "calls") == 1
    for _ in range(2):
        with pytest.raises(MCPError) as lost:
            await client.call_tool(
                "charge", {"amount": 7, "crash": "after"}, meta=meta_key("order-2")
            )
        assert lost.value.code == wire.OUTCOME_UNKNOWN, lost.value
    assert lines(ledger / "effects") == 2


@pytest.mark.parametrize("path", ["fast", "fastmcp"])
async def test_a_guarded_call_keeps_the_contract_on_both_paths(
    anyio_backend: str,
    path: str,
    node_servers: NodeServers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One effect across a re-send, the replay marker, -32011 for the key with other
    arguments, -32012 when the upstream dies mid-call (and on the re-send of that key): on the
    fast path, and on FastMCP's (taken once a user adds a middleware of their own)."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    proxy = build_proxy(Upstream.stdio(*node_servers.ledger(ledger)), MemoryKeyStore())
    if path == "fastmcp":
        proxy.add_middleware(Middleware())  # a user's own: every call takes FastMCP's path
    async with proxy.opened(), InProcess(proxy) as client:
        dispatched = _dispatches(monkeypatch)
        await _charged_once_then_lost(client, ledger)
        after = await client.call_tool("charge", {"amount": 8}, meta=meta_key("order-3"))
        assert status(after) == "executed" and lines(ledger / "effects") == 3
        # The path under test: on FastMCP's, its dispatch (True) for every call, around its core
        # run (False) where the tool runs; on the fast path, neither for order-1 and order-2 (the
        # call goes upstream raw); after the child died the link must reconnect: FastMCP's path
        # for order-2's re-send (the guard answers) and order-3, either way.
        expected = [True, True, False] if path == "fast" else [True, False, True, True, True, False]
        assert dispatched[: len(expected)] == expected, dispatched


async def test_an_upstream_idempotent_tool_keeps_the_link_s_re_sending_call(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool the policy declares `upstream_idempotent` is re-sent by the link within its
    deadline: its guarded call keeps the link's own call (`OnceProxyTool.run`), not the raw
    send; every other guarded tool goes raw."""
    ledger = tmp_path / "effects"
    policy = ProxyPolicy((ToolRule("write", upstream_idempotent=True),))
    async with _guarding(ledger, policy=policy) as client:
        runs = _count_runs(monkeypatch)
        result = await client.call_tool("write", {"text": "linked"}, meta=meta_key("i1"))
        assert (result.meta or {})[MARKER]["status"] == "executed"
        assert runs == ["write"] and lines(ledger) == 1


async def test_an_upstream_refusal_on_the_raw_send_is_passed_on_and_released(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upstream's own JSON-RPC error for a guarded call sent raw reaches the caller as it
    was sent (code, message, data), nothing stored: the key is released, and its next call
    runs."""
    ledger = tmp_path / "effects"
    async with _guarding(ledger, "refusing_server.py") as client:
        runs = _count_runs(monkeypatch)
        with pytest.raises(MCPError) as refused:
            await client.call_tool_mcp("pay", {"amount": -1}, meta=meta_key("r1"))
        error = refused.value
        assert (error.code, error.message) == (INVALID_PARAMS, "amount must be positive")
        assert error.data == {"amount": -1} and lines(ledger) == 0
        after = await client.call_tool("pay", {"amount": 3}, meta=meta_key("r1"))
        assert (after.meta or {})[MARKER]["status"] == "executed"
        assert lines(ledger) == 1 and runs == [], "not the raw send"


@pytest.mark.parametrize("path", ["fast", "fastmcp"])
async def test_a_guarded_call_sent_raw_keeps_fastmcp_s_tool_span(
    anyio_backend: str, path: str, tmp_path: Path
) -> None:
    """The raw send runs under FastMCP's span for the tool (`tools/call write`, labelled with
    the tool's attributes, as FastMCP's core run labels it), with the guard's span around it,
    on the fast path as on FastMCP's."""
    spans = recorder()
    upstream = Upstream.stdio(
        sys.executable, str(HERE / "changing_server.py"), str(tmp_path / "effects")
    )
    proxy = build_proxy(upstream, MemoryKeyStore())
    if path == "fastmcp":
        proxy.add_middleware(Middleware())
    async with proxy.opened(), Client(proxy) as client:
        await client.list_tools()
        spans.clear()
        await client.call_tool("write", {"text": "traced"}, meta=meta_key("s1"))
    named = {span.name: span for span in spans.get_finished_spans()}
    tool_span = named["tools/call write"]
    assert (tool_span.attributes or {}).get("fastmcp.component.key") == "write", tool_span
    assert any("idempotency" in name or "guard" in name for name in named), sorted(named)


@pytest.mark.parametrize("path", ["fast", "fastmcp"])
async def test_an_http_upstream_s_calls_keep_the_contract_on_both_paths(
    anyio_backend: str,
    path: str,
    node_servers: NodeServers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ledger server over streamable HTTP, a handshake-era caller: a pass-through read goes
    upstream raw (no `OnceProxyTool.run`, no FastMCP dispatch), and so does a guarded call (no
    link call either, but for one that never left, which the link's call re-sends); one effect
    across a re-send, the replay marker, the record's key upstream, -32012 when the upstream dies
    mid-call; while it is down, the read fails and a guarded call is -32013 "unreachable" with
    nothing run; back on its port, the same key runs once. FastMCP's path (a user's middleware
    added) holds the same outcomes. On main (no HTTP upstream on the fast path) the fast
    variant fails: FastMCP dispatched every call."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()

    def command(port: int) -> list[str]:
        return node_servers.ledger(ledger, "--port", str(port))

    async with _legacy_caller_of(command, path) as (upstream, client):
        await client.list_tools()
        runs = _count_runs(monkeypatch)
        dispatched = _dispatches(monkeypatch)
        linked = _spy(monkeypatch, UpstreamLink, "call", lambda _, kw: kw["resend"])
        read = await client.call_tool_mcp("balance", {})
        assert text(read) == "0" and status(read) is None
        await _charged_once_then_lost(client, ledger)
        # On the fast path each guarded call went raw (no link call); on FastMCP's, each
        # one the guard ran went through the link's retrying call.
        assert linked == ([] if path == "fast" else [False, False]), linked
        # The path under test: on the fast path no FastMCP dispatch (True) at all, each
        # guarded call's core run (False), the read not run by FastMCP; on FastMCP's, its
        # dispatch around each call, and its core run where the tool runs.
        if path == "fast":
            assert dispatched == [] and runs == [], (dispatched, runs)
        else:
            assert dispatched == [True, False, True, False, True, True, True, False, True]
            assert runs == ["balance", "charge", "charge"], runs
        # Down (it crashed above): the read fails, the write never reaches it.
        # (The read as it came out of the SDK's HTTP client on the fast path, a JSON-RPC
        # error; FastMCP's path wraps the same error in an `isError` result.)
        if path == "fast":
            with pytest.raises(MCPError):
                await client.call_tool_mcp("balance", {})
        else:
            assert (await client.call_tool_mcp("balance", {})).is_error
        with pytest.raises(MCPError) as unsent:
            await client.call_tool("charge", {"amount": 8}, meta=meta_key("order-3"))
        assert unsent.value.code == wire.STORE_UNAVAILABLE, unsent.value
        assert unsent.value.data["upstream"] == "unreachable"
        assert lines(ledger / "calls") == 2
        # Refused before it left: on the fast path the raw send knew (the retry-aware
        # transport), and the link's own call took over to re-send within its deadline.
        assert linked == [False] * (1 if path == "fast" else 3), linked
        await anyio.to_thread.run_sync(upstream.start)
        after = await client.call_tool("charge", {"amount": 8}, meta=meta_key("order-3"))
        assert status(after) == "executed" and lines(ledger / "effects") == 3
        assert text(await client.call_tool_mcp("balance", {})) == "3"
        if path == "fast":
            assert True not in dispatched, dispatched


@pytest.mark.parametrize("path", ["fast", "fastmcp"])
async def test_a_pass_through_after_a_stateful_http_upstream_restarts_is_answered(
    anyio_backend: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SDK server that keeps sessions (`benchmarks._hop_upstream`), SIGKILLed and started
    again on its port: it no longer knows the link's session and refuses the next request on it
    with HTTP 404, before running anything. A handshake-era caller's pass-through read then gets
    its answer, on a new session (the forgotten one asked once), and so does every read after it
    (on main each got "Session not found" until a guarded call replaced the session)."""

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "benchmarks._hop_upstream", "--port", str(port)]

    async with _legacy_caller_of(command, path) as (upstream, client):
        assert text(await client.call_tool_mcp("read", {"text": "before"})) == "before"
        runs = _count_runs(monkeypatch)
        statuses = _upstream_statuses(monkeypatch)
        await anyio.to_thread.run_sync(upstream.restart)
        for n in range(3):
            read = await client.call_tool_mcp("read", {"text": f"after {n}"})
            assert not read.is_error and text(read) == f"after {n}", read
        assert runs == ([] if path == "fast" else ["read"] * 3), runs
        assert statuses.count(("POST", 404)) == 1, statuses  # the forgotten session asked once


async def test_a_guarded_raw_send_to_a_restarted_http_upstream_is_re_sent_on_a_new_session(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stateful HTTP upstream (FastMCP's) restarted between two guarded calls forgets the
    link's session: the raw send is refused with its 404 before it runs, so the link's own call
    takes over and re-sends the same key on a new session, and the call runs once (executed,
    one effect); the next call goes raw on the new session. The forgotten session is asked
    once: the upstream answers one 404 per restart (on main the link's call tried that session
    again first, its listing and the call: three)."""
    ledger = tmp_path / "effects"
    script = str(HERE / "changing_server.py")
    upstream = ServerProcess(lambda port: [sys.executable, script, str(ledger), str(port)])
    await anyio.to_thread.run_sync(upstream.start)
    try:
        proxy = build_proxy(Upstream.http(upstream.url), MemoryKeyStore())
        async with proxy.opened(), Client(proxy, mode="legacy") as client:
            await client.list_tools()
            linked = _spy(monkeypatch, UpstreamLink, "call", lambda _, kw: kw["resend"])
            statuses = _upstream_statuses(monkeypatch)
            first = await client.call_tool("write", {"text": "a"}, meta=meta_key("r1"))
            assert (first.meta or {})[MARKER]["status"] == "executed" and linked == []
            await anyio.to_thread.run_sync(upstream.kill)
            await anyio.to_thread.run_sync(upstream.start)
            second = await client.call_tool("write", {"text": "b"}, meta=meta_key("r2"))
            assert (second.meta or {})[MARKER]["status"] == "executed"
            assert linked == [False] and lines(ledger) == 2, linked
            # The forgotten session is asked once (its DELETE as the link closes it aside).
            assert statuses.count(("POST", 404)) == 1, statuses
            third = await client.call_tool("write", {"text": "c"}, meta=meta_key("r3"))
            assert (third.meta or {})[MARKER]["status"] == "executed"
            assert linked == [False] and lines(ledger) == 3, linked
    finally:
        upstream.kill()


async def test_an_http_upstream_s_log_line_reaches_the_caller_of_a_raw_pass_through(
    anyio_backend: str, node_servers: NodeServers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call passed through raw to an HTTP upstream (a handshake-era caller) still forwards
    what the upstream sends while it runs: the ledger server's log line reaches the caller."""
    logs: list[Any] = []

    async def on_log(message: Any) -> None:
        data = message.data  # FastMCP relays a line as {"msg": ..., "extra": ...}
        logs.append(data["msg"] if isinstance(data, dict) else data)

    ledger = tmp_path / "ledger"
    ledger.mkdir()
    upstream = ServerProcess(lambda port: node_servers.ledger(ledger, "--port", str(port)))
    await anyio.to_thread.run_sync(upstream.start)
    try:
        policy = parse_policy({"tools": {"consult": {"guard": False}}})
        proxy = build_proxy(Upstream.http(upstream.url), MemoryKeyStore(), policy=policy)
        async with proxy.opened(), Client(proxy, mode="legacy", log_handler=on_log) as client:
            await client.list_tools()
            runs = _count_runs(monkeypatch)
            result = await client.call_tool_mcp("consult", {"ask": "nothing"})
            assert text(result) == "nothing: nothing asked" and status(result) is None
            assert runs == [], "not the raw pass-through"
            assert logs == ["consulting #1"] and lines(ledger / "effects") == 1
    finally:
        upstream.kill()


async def test_an_http_upstream_s_sampling_request_reaches_the_caller_of_a_raw_pass_through(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conformance fixture (a stateful HTTP upstream) asks for sampling while a call passed
    through raw runs: the request reaches the handshake-era caller and its answer goes back."""
    prompts: list[str] = []

    async def sample(messages: list[Any], params: Any, context: Any) -> str:
        prompts.append(str(messages[0].content.text))
        return "sampled"

    with conformance_fixture() as url:
        policy = parse_policy({"tools": {"test_sampling": {"guard": False}}})
        proxy = build_proxy(Upstream.http(url), MemoryKeyStore(), policy=policy)
        client = Client(proxy, sampling_handler=sample, mode="legacy")
        async with proxy.opened(), client:
            await client.list_tools()
            runs = _count_runs(monkeypatch)
            result = await client.call_tool_mcp("test_sampling", {"prompt": "p-1"})
            assert text(result) == "LLM response: sampled" and status(result) is None
            assert prompts == ["p-1"] and runs == [], (prompts, runs)


#: A stdio upstream whose one tool reports progress as the conformance fixture's does.
_PROGRESSING = """
from fastmcp import Context, FastMCP

server = FastMCP("progressing")


@server.tool
async def test_tool_with_progress(ctx: Context) -> str:
    for step in (0, 50, 100):
        await ctx.report_progress(step, 100)
    asked = "progressToken" in (ctx.request_context.meta or {})
    return "asked" if asked else "not asked"


server.run(transport="stdio", show_banner=False)
"""


@contextmanager
def _progressing(kind: str) -> Iterator[Upstream]:
    """An upstream whose `test_tool_with_progress` reports 0, 50, 100: the conformance fixture
    over HTTP, or the same tool as a stdio server of its own."""
    if kind == "stdio":
        yield Upstream.stdio(sys.executable, "-c", _PROGRESSING)
        return
    with conformance_fixture() as url:
        yield Upstream.http(url)


async def _progress_seen(
    upstream: Upstream,
    path: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    guarded: bool,
    ask: bool = True,
) -> tuple[Any, list[float], list[bool], list[str]]:
    """A call of `test_tool_with_progress` through a proxy (guarded and keyed, or passed
    through: the policy leaves it unguarded) whose caller asks for progress (or, without `ask`,
    does not: the SDK's session, as FastMCP's client asks on every call), on the fast path or,
    with a user's middleware added, FastMCP's: its result, the progress its caller got,
    FastMCP's dispatches (`_dispatches`) and the proxied tool's runs (`_count_runs`)."""
    seen: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    rules = {} if guarded else {"tools": {"test_tool_with_progress": {"guard": False}}}
    proxy = build_proxy(upstream, MemoryKeyStore(), policy=parse_policy(rules))
    if path == "fastmcp":
        proxy.add_middleware(Middleware())
    async with proxy.opened(), Client(proxy, mode="legacy") as client:
        await client.list_tools()
        dispatched = _dispatches(monkeypatch)
        runs = _count_runs(monkeypatch)
        meta = meta_key("p1") if guarded else None
        if ask:
            result = await client.call_tool(
                "test_tool_with_progress", {}, meta=meta, progress_handler=progress
            )
        else:
            result = await client.session.call_tool(
                "test_tool_with_progress", {}, meta=cast(Any, meta)
            )
    return result, seen, dispatched, runs


@pytest.mark.parametrize("path", ["fast", "fastmcp"])
@pytest.mark.parametrize("upstream_kind", ["http", "stdio"])
async def test_a_guarded_call_asking_for_progress_gets_the_upstream_s_progress(
    anyio_backend: str, upstream_kind: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed call of a guarded tool whose caller asks for progress (its token in `_meta`, which
    the SDK parses as `progress_token`) gets the upstream's progress notifications, over an HTTP
    upstream and a stdio one: on the fast path by the raw send, without FastMCP's dispatch or run
    (its client asks for progress on every call), and on FastMCP's path by the link's call.
    Before, the raw send relayed none (the conformance suite's tools-call-with-progress failed
    through `mcp-once proxy` once guarded HTTP calls went raw), and over a stdio upstream neither
    path did: the relay looked the caller's request up when the notification came, in the stdio
    reader's task, where none is bound (`forwarding.progress_relay`)."""
    with _progressing(upstream_kind) as upstream:
        result, seen, dispatched, runs = await _progress_seen(
            upstream, path, monkeypatch, guarded=True
        )
    assert (result.meta or {})[MARKER]["status"] == "executed"
    assert seen == [0, 50, 100], seen
    if path == "fast":
        assert dispatched == [] and runs == [], (dispatched, runs)
    else:
        assert dispatched[:1] == [True] and runs == ["test_tool_with_progress"], (dispatched, runs)


@pytest.mark.parametrize("path", ["fast", "fastmcp"])
@pytest.mark.parametrize("upstream_kind", ["http", "stdio"])
async def test_a_passed_through_call_asking_for_progress_gets_the_upstream_s_progress(
    anyio_backend: str, upstream_kind: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call the proxy passes through (the policy leaves the tool unguarded) whose caller asks
    for progress gets the upstream's progress, over an HTTP upstream and a stdio one, on the fast
    path (without FastMCP's run) as on FastMCP's. Before, the fast path sent the caller's own
    token upstream, which named no request of the proxy's upstream session (or another call's,
    whose id it happened to match): every notification was dropped there."""
    with _progressing(upstream_kind) as upstream:
        result, seen, dispatched, runs = await _progress_seen(
            upstream, path, monkeypatch, guarded=False
        )
    assert MARKER not in (result.meta or {})  # passed through: nothing stored, no marker
    assert seen == [0, 50, 100], seen
    if path == "fast":
        assert dispatched == [] and runs == [], (dispatched, runs)
    else:
        assert dispatched[:1] == [True] and runs == ["test_tool_with_progress"], (dispatched, runs)


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "passed-through"])
async def test_a_call_not_asking_for_progress_does_not_ask_the_upstream(
    anyio_backend: str, guarded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the fast path a caller that sends no progress token gets no progress, and the upstream
    is not asked for any (no `progressToken` on its request): the proxy passes on what the caller
    asked. (FastMCP's path asks on every call: its client does.)"""
    with _progressing("stdio") as upstream:
        result, seen, _, _ = await _progress_seen(
            upstream, "fast", monkeypatch, guarded=guarded, ask=False
        )
    assert text(result) == "not asked" and seen == [], (result, seen)
    assert status(result) == ("executed" if guarded else None)


async def test_a_guarded_call_not_asking_for_progress_relays_none_to_an_earlier_caller(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastMCP's client sends every call with a progress handler, its own when the call names
    none: the proxy client's, which relays to the request FastMCP's own run of a passed-through
    call last stashed on the link's shared client, another caller's (long answered). A guarded
    call on FastMCP's path whose caller asked for no progress relays none, to anyone (the front
    sessions' progress notifications counted as the proxy sends them)."""
    sent = _spy(monkeypatch, ServerSession, "send_progress_notification", lambda _, kw: kw)
    with _progressing("stdio") as upstream:
        proxy = build_proxy(upstream, MemoryKeyStore(), keys="optional")
        proxy.add_middleware(Middleware())
        async with proxy.opened(), Client(proxy) as earlier, Client(proxy) as later:
            runs = _count_runs(monkeypatch)
            # Keyless: passed through by the guard, FastMCP's own run (which stashes its request).
            passed = await earlier.call_tool("test_tool_with_progress", {})
            assert status(passed) is None and runs == ["test_tool_with_progress"]
            assert [note["progress"] for note in sent] == [0, 50, 100], sent
            keyed = await later.session.call_tool(
                "test_tool_with_progress", {}, meta=cast(Any, meta_key("n1"))
            )
            assert status(keyed) == "executed"
    assert len(sent) == 3, sent


async def test_a_keyless_call_the_guard_passes_through_is_run_on_the_fast_path(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `keys="optional"` the guard passes a keyless call of a guarded tool through (no
    claim): it runs once, as FastMCP's core runs it, unmarked (it used to reach the raw send,
    which runs only under a claim, and fail as -32603); a keyed call is still guarded raw."""
    ledger = tmp_path / "effects"
    upstream = Upstream.stdio(sys.executable, str(HERE / "changing_server.py"), str(ledger))
    proxy = build_proxy(upstream, MemoryKeyStore(), keys="optional")
    async with proxy.opened(), Client(proxy) as client:
        await client.list_tools()
        dispatched = _dispatches(monkeypatch)
        plain = await client.call_tool("write", {"text": "keyless"})
        assert plain.content[0].text == "wrote keyless"  # type: ignore[union-attr]
        assert MARKER not in (plain.meta or {}) and lines(ledger) == 1
        assert dispatched == [False], "not FastMCP's core run below the guard"
        keyed = await client.call_tool("write", {"text": "keyed"}, meta=meta_key("o1"))
        assert (keyed.meta or {})[MARKER]["status"] == "executed"
        assert dispatched == [False] and lines(ledger) == 2


@pytest.mark.parametrize("sdk", [True, False], ids=["otel-sdk", "no-sdk"])
async def test_a_guarded_call_sent_raw_enters_its_tool_with_or_without_an_otel_sdk(
    anyio_backend: str,
    sdk: bool,
    node_servers: NodeServers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without an OpenTelemetry SDK the raw send skips FastMCP's tool span (a no-op there) but
    keeps its seam, `get_span_attributes`: an upstream that dies mid-call leaves the record
    OUTCOME_UNKNOWN (-32012), never released to run again. With an SDK, FastMCP's span is
    opened as before."""
    if sdk:
        recorder()
    else:
        monkeypatch.setattr(fast_path, "get_tracer_provider", ProxyTracerProvider)
    opened: list[str] = []
    span = fast_path.server_span

    @contextmanager
    def spied(name: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        opened.append(name)
        with span(name, *args, **kwargs) as inner:
            yield inner

    monkeypatch.setattr(fast_path, "server_span", spied)
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    proxy = build_proxy(Upstream.stdio(*node_servers.ledger(ledger)), MemoryKeyStore())
    async with proxy.opened(), InProcess(proxy) as client:
        first = await client.call_tool("charge", {"amount": 5}, meta=meta_key("e1"))
        assert status(first) == "executed"
        for _ in range(2):  # the call, then its re-send: UNKNOWN, never re-run
            with pytest.raises(MCPError) as lost:
                await client.call_tool(
                    "charge", {"amount": 7, "crash": "after"}, meta=meta_key("e2")
                )
            assert lost.value.code == wire.OUTCOME_UNKNOWN
    assert lines(ledger / "effects") == 2
    assert opened == (["tools/call charge"] * 2 if sdk else []), opened


@pytest.mark.parametrize("path", ["fast", "fastmcp"])
async def test_an_upstream_answering_a_result_that_is_not_mcp_s_leaves_the_record_unknown(
    anyio_backend: str, path: str, tmp_path: Path
) -> None:
    """The upstream had its effect, then answered with a result that is not MCP's: the call and
    its re-send are OUTCOME_UNKNOWN (-32012), and the effect happened once. (It used to reach
    the caller as -32602 "Invalid request parameters", the claim released, so the re-send ran
    the effect again, on both paths.)"""
    ledger = tmp_path / "effects"
    upstream = Upstream.stdio(sys.executable, str(HERE / "garbled_server.py"), str(ledger))
    proxy = build_proxy(upstream, MemoryKeyStore())
    if path == "fastmcp":
        proxy.add_middleware(Middleware())
    async with proxy.opened(), Client(proxy) as client:
        await client.list_tools()
        for _ in range(2):
            with pytest.raises(MCPError) as lost:
                await client.call_tool_mcp("pay", {"amount": 3}, meta=meta_key("g1"))
            assert lost.value.code == wire.OUTCOME_UNKNOWN, lost.value
            assert "not MCP's" in lost.value.message, lost.value
    assert lines(ledger) == 1
