"""The fast path: a `tools/call` to a live upstream, served without FastMCP's dispatch.

Why it bypasses FastMCP: a call the proxy passes through (a read-only tool, or one the policy
leaves unguarded) has nothing for the proxy to do but forward it, yet FastMCP's path cost it
~40 % of the proxy's CPU per call (benchmarks/README.md, "The proxy hop"): a `Context`, the
middleware chain, a second tool lookup, a `ProxyTool` run that builds a typed request, a typed
`CallToolResult` whose structured content the client library validates again against the output
schema the upstream already held it to, a `ToolResult`, and a `CallToolResult` again for the
wire. Here the front's SDK handler for `tools/call` is wrapped: such a call goes to the upstream
session with the caller's arguments and forwardable `_meta`, and the upstream's result goes back
as a plain dict (the SDK's own wire checks on both sides stay: the front's result sieve, the
upstream session's result check).

A call the proxy guards is not guarded a second way here: it goes through the proxy's guard
middleware itself (`ProxyGuardMiddleware.on_call_tool`, hence `IdempotencyMiddleware`'s one
`Guard.call`: claim, replay, completion, its errors, spans, log lines and events), skipping
FastMCP's dispatch around it (its `tools/call` handler, the middleware chain, the extension
interceptors), which guard nothing for the proxy's own middleware. Below the guard the tool run
is raw too (`_sent`): the caller's arguments go upstream under the record's upstream key, and
the upstream's result is read once, as the record keeps it, instead of passing through FastMCP's
core run, `OnceProxyTool.run`, the link's retrying session and the client library's typed call
(~30 % of the proxy's CPU per guarded call: benchmarks/README.md). A tool the policy declares
`upstream_idempotent` keeps the link's own call, which re-sends it within the link's deadline.

An HTTP upstream is served here too, for a handshake-era caller while that era's session is
open (`UpstreamLink.raw_ready`): a passed-through call goes raw to the caller's era's session
(`UpstreamLink.client` reads the era from the bound request, no `Context` needed), under the
client's watch on its session task (`UpstreamLink.send_raw`: over HTTP a server's failure can end
that task instead of the request). A guarded call goes raw too (`_sent`), its one attempt judged
by the client library's own classifier (`orchestrator.attempt_once`): the link's retry-aware HTTP
transport notes whether the request left, so a failure is "may have run" (UNKNOWN) or "not run"
(refused, a 404 for a session the upstream forgot, its store down), and the call that did not
run is handed to the link's own `RetryingSession` call, which re-sends it within its deadline on a
fresh session (or gives up: released, -32013). The retrying call was ~30 % of the guarded call's
handler CPU over HTTP (benchmarks/README.md, "Guarded calls to an HTTP upstream sent raw").

FastMCP's path stays for everything this one does not serve (`_served` says what it serves): a
task-augmented call (`params.task`), an input_required continuation, a call naming a FastMCP
version, a 2026-07-28 caller's call to an HTTP upstream (its input-required
rounds and `Mcp-Param-*` headers are the SDK's typed `call_tool`'s to send) or one declaring the
tasks extension (the link's task-declaring session is `OnceProxyTool`'s), a tool FastMCP does
not list (unknown, disabled), a link whose session must first be (re)opened, and any server a
user added middleware of their own to (it must see every call). The per-principal in-flight
bound (`InFlightLimit`) and the forwarding of the upstream's log lines, questions and progress
to the caller (`forwarding.py`: a call asking for progress gets the upstream's on either path,
over stdio as over HTTP) hold on both paths.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import anyio
from fastmcp.exceptions import DisabledError, FastMCPError, NotFoundError
from fastmcp.server.context import Context
from fastmcp.server.dependencies import fastmcp_request_ctx
from fastmcp.server.extensions import read_client_extension_settings as declared
from fastmcp.server.middleware import MiddlewareContext
from fastmcp.server.telemetry import server_span
from fastmcp.tools.base import InputRequiredToolResult, ToolResult
from mcp import MCPError
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    CONNECTION_CLOSED,
    INVALID_PARAMS,
    PROTOCOL_VERSION_META_KEY,
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry.trace import ProxyTracerProvider, get_tracer_provider
from pydantic import BaseModel, TypeAdapter

from idempotency import Claim, current_claim, wire
from idempotency.fastmcp import as_call_tool_result
from orchestrator import (
    TASKS_EXTENSION,
    NotExecuted,
    OutcomeUnknown,
    attempt_once,
    session_gone,
    tool_session,
)

from .failures import UpstreamUnreachable
from .forwarding import progress_relay
from .limits import InFlightLimit
from .lookup import PerCall
from .tools import (
    OnceProxyTool,
    in_guard_terms,
    lost,
    refused,
    tool_result,
    upstream_key,
)

if TYPE_CHECKING:
    from fastmcp import FastMCP
    from fastmcp.server.middleware import Middleware
    from fastmcp.tools.base import Tool
    from mcp.server.context import HandlerResult, ServerRequestContext
    from mcp.shared.dispatcher import ProgressFnT

    from .middleware import ProxyGuardMiddleware
    from .upstream import UpstreamLink

#: The upstream's result as it came (the session still checks it against the wire schema).
_RAW: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])

#: `_meta` keys a passed-through call does not take upstream: those that describe the front
#: connection, not the upstream one (FastMCP's proxy drops the same ones: the 2026-07-28 era's
#: per-request protocol version, client info and capabilities), and the caller's progress token
#: (the SDK's parsed spelling), which the link's session replaces by its own (`_forward`).
_NOT_FORWARDED = frozenset(
    {
        PROTOCOL_VERSION_META_KEY,
        CLIENT_INFO_META_KEY,
        CLIENT_CAPABILITIES_META_KEY,
        "progress_token",
    }
)


def install(
    server: FastMCP[Any],
    link: UpstreamLink,
    guard: ProxyGuardMiddleware,
    limit: InFlightLimit | None,
) -> None:
    """Serve `server`'s calls to `link` on the fast path (its middleware as it is now is the
    proxy's own: a middleware added later sends every call FastMCP's way)."""
    low = server._mcp_server
    entry = low.get_request_handler("tools/call")
    assert entry is not None, "FastMCP registers tools/call"
    own: Sequence[Middleware] = tuple(server.middleware)
    slow = entry.handler
    server_ref = weakref.ref(server)

    async def handle(ctx: ServerRequestContext[Any, Any], params: BaseModel) -> HandlerResult:
        assert isinstance(params, CallToolRequestParams)  # the params type FastMCP registered
        served = server_ref()
        if served is None or not _own(served, own):
            return await slow(ctx, params)
        with PerCall():
            served_as = await _served(served, link, ctx, params)
            if served_as is None:
                return await slow(ctx, params)
            guarded = served_as if guard.guard_of(served_as) is not None else None
            if limit is None:
                return await _serve(served, link, guard, guarded, ctx, params, server_ref)
            with limit.admitted():
                return await _serve(served, link, guard, guarded, ctx, params, server_ref)

    low.add_request_handler("tools/call", entry.params_type, handle)


def _own(server: FastMCP[Any], own: Sequence[Middleware]) -> bool:
    """Whether `server`'s middleware is still the proxy's own (none added since `install`)."""
    chain = server.middleware
    return len(chain) == len(own) and all(a is b for a, b in zip(chain, own, strict=True))


async def _served(
    server: FastMCP[Any],
    link: UpstreamLink,
    ctx: ServerRequestContext[Any, Any],
    params: CallToolRequestParams,
) -> Tool | None:
    """The tool of a call the fast path serves (see the module doc); None for FastMCP's path."""
    meta = ctx.meta
    if (
        params.task is not None
        or params.input_responses is not None
        or params.request_state is not None
        or (meta is not None and "fastmcp" in meta)
        or not link.raw_ready(ctx.protocol_version)
        or (link.upstream.url is not None and declared(ctx, TASKS_EXTENSION) is not None)
    ):
        return None
    return await server.get_tool(params.name)  # FastMCP's own lookup: visibility, auth, cache


async def _serve(
    server: FastMCP[Any],
    link: UpstreamLink,
    guard: ProxyGuardMiddleware,
    guarded: Tool | None,
    ctx: ServerRequestContext[Any, Any],
    params: CallToolRequestParams,
    server_ref: weakref.ref[FastMCP[Any]],
) -> HandlerResult:
    """A guarded call (of tool `guarded`) through the guard, a passed-through one forwarded as
    it came."""
    if guarded is not None:
        return await _guarded(server, link, guard, guarded, ctx, params)
    return await _forward(link, ctx, params, server_ref)


async def _guarded(
    server: FastMCP[Any],
    link: UpstreamLink,
    guard: ProxyGuardMiddleware,
    tool: Tool,
    ctx: ServerRequestContext[Any, Any],
    params: CallToolRequestParams,
) -> HandlerResult:
    """The call under the proxy's guard middleware itself (`ProxyGuardMiddleware.on_call_tool`:
    the one guard, its errors, spans, log lines and records), the tool run sent upstream raw
    (`_sent`; an `upstream_idempotent` tool's by FastMCP's own core, `call_tool(run_middleware=
    False)`, for the link's re-sends), and the outcome put on the wire as FastMCP's `tools/call`
    handler puts it. What this skips is FastMCP's dispatch around them: its handler, the
    middleware chain (the proxy's own: the in-flight bound is held by `install`, the metadata
    middleware has no call hook) and the extension interceptors (a task-augmented call never
    comes here)."""
    arguments = params.arguments or {}
    message = CallToolRequestParams(name=params.name, arguments=arguments)

    async def run(context: MiddlewareContext[CallToolRequestParams]) -> ToolResult:
        call = context.message
        claim = current_claim()
        # Raw only under the guard's claim: a call the guard passes through (no key and none
        # to derive, `keys="optional"`, fail-open with the store down) is FastMCP's own run,
        # as without the guard.
        if raw and claim is not None:
            assert isinstance(tool, OnceProxyTool) and context.fastmcp_context is not None
            ctx = context.fastmcp_context
            return await _sent(server, link, tool, claim, call.arguments or {}, ctx, progress)
        return await server.call_tool(call.name, call.arguments or {}, run_middleware=False)

    # An `upstream_idempotent` tool's call is re-sent by the link within its deadline: the
    # link's own call (`OnceProxyTool.run`) keeps that; every other goes raw (`_sent`).
    raw = isinstance(tool, OnceProxyTool) and not guard.resend(tool.name)
    # The upstream's progress reaches the caller, if it asked (FastMCP's client asks on every
    # call), as on the link's call.
    progress = progress_relay(fastmcp_request_ctx.get())

    async with Context(fastmcp=server) as fastmcp_ctx:
        context = MiddlewareContext(
            message=message,
            fastmcp_context=fastmcp_ctx,
            source="client",
            type="request",
            method="tools/call",
        )
        try:
            result = await guard.call(tool, context, run)
        except (DisabledError, NotFoundError):
            return _error_result(f"Unknown tool: {params.name!r}")
        except FastMCPError as exc:  # a tool-visible error is a result (FastMCP's handler)
            return _error_result(str(exc))
    if not isinstance(result, ToolResult):  # the key's answer is a task (`tasks.py`)
        return result
    if isinstance(result, InputRequiredToolResult):
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            raise MCPError(
                INVALID_PARAMS,
                f"Tool {params.name!r} returned an InputRequiredResult, which only exists at"
                f" MCP 2026-07-28; this connection negotiated {ctx.protocol_version!r}.",
            )
        return result.input_required
    return as_call_tool_result(result)


def _error_result(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


async def _forward(
    link: UpstreamLink,
    ctx: ServerRequestContext[Any, Any],
    params: CallToolRequestParams,
    server_ref: weakref.ref[FastMCP[Any]],
) -> dict[str, Any]:
    """The call sent upstream as it came; the upstream's result as it came back. Its progress
    token is the link session's own, whose notifications reach the caller under the caller's
    (`progress_relay`): the caller's token named no request of the proxy's upstream session, so
    the upstream's progress was dropped there, or handed to another call whose request id it
    matched."""
    meta = {k: v for k, v in (ctx.meta or {}).items() if k not in _NOT_FORWARDED}
    request = CallToolRequest(
        params=CallToolRequestParams(
            name=params.name, arguments=params.arguments or {}, _meta=cast(Any, meta or None)
        )
    )
    # The upstream's log lines, questions and progress reach this call's caller while it runs.
    request_context = fastmcp_request_ctx.get()
    with link.forwarding.serving_request(request_context, server_ref):
        try:
            result = await link.forward(request, progress_relay(request_context))
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                # The child died under the call: retryable, and the next call goes to the
                # session that replaces it (as FastMCP's path answers).
                raise UpstreamUnreachable() from exc
            raise
    # The upstream link speaks the handshake era; a 2026-07-28 front's result names its type
    # (the front's own wire check sieves it away for a 2025-era caller).
    result.setdefault("resultType", "complete")
    return result


async def _sent(
    server: FastMCP[Any],
    link: UpstreamLink,
    tool: OnceProxyTool,
    claim: Claim,
    arguments: dict[str, Any],
    ctx: Context,
    progress: ProgressFnT | None = None,
) -> ToolResult:
    """The guarded call's tool run, sent upstream raw: what FastMCP's core run and
    `OnceProxyTool.run` do for it (FastMCP's span for the tool, which also tells the guard the
    tool was entered; the record's upstream key in `_meta`; the upstream's log lines and
    questions forwarded to the caller; the link's failures in the guard's terms,
    `tools.in_guard_terms`; the link's deadline), without their layers: FastMCP's second lookup
    and `Context`, the link's retrying session and the client library's typed call, which
    validates the upstream's structured content against the schema the upstream already held it
    to. The upstream's result is read once, by the session, as the record keeps it (a
    `CallToolResult`). `claim`: the guard's, under which it runs the tool; `progress`: where
    the upstream's progress goes (`progress_relay`'s, when the caller asked for it)."""
    name = tool._backend_name or tool.name
    key = upstream_key(claim)
    meta = {wire.KEY_META: key, wire.ATTEMPT_META: 1}  # as the link's session sends a first try
    request = CallToolRequest(
        params=CallToolRequestParams(name=name, arguments=arguments, _meta=cast(Any, meta))
    )
    retry = link.retry
    budget = retry.deadline if retry.attempt_timeout is None else retry.attempt_timeout
    client = await link.client()  # before the tool is entered: a failure here ran nothing
    stdio = link.upstream.url is None

    async def send() -> CallToolResult:
        # `anyio.fail_after`'s deadline, without its generator-based context manager.
        with anyio.CancelScope(deadline=anyio.current_time() + min(budget, retry.deadline)):
            return await link.sent(client, request, CallToolResult, progress)
        raise TimeoutError

    with (
        _entered(server, tool),
        link.forwarding.serving(ctx),
        in_guard_terms(name, claim, stdio=stdio),
    ):
        if stdio:
            result = await _over_stdio(send, name, claim)
        else:
            try:
                # Judged as the link's session judges an attempt: over HTTP its retry-aware
                # transport notes whether the request left (`orchestrator.attempt_once`).
                result = await attempt_once(
                    send, tool=name, key=key, closed=lambda: tool_session(client).closed()
                )
            except NotExecuted as exc:
                # Nothing ran (the connection refused, the upstream forgot the session, its
                # store down): the link's own call takes over, which re-sends within its
                # deadline, on a fresh session where the old one is gone. A forgotten session
                # is put aside first, so the link's call opens a new one at once instead of
                # asking that one again (its listing and the call: two more 404s).
                gone = exc.last_error
                if gone is not None and session_gone(gone):
                    link.discard(client)
                again = await link.call(name, arguments, key, resend=False, progress=progress)
                assert isinstance(again, CallToolResult)  # a plain handshake-era call
                result = again
    answer = tool_result(result)
    assert isinstance(answer, ToolResult)  # a plain call answers with a result
    return answer


async def _over_stdio(
    send: Callable[[], Awaitable[CallToolResult]], name: str, claim: Claim
) -> CallToolResult:
    """`send()`'s result over stdio, where a failure is one of two: the child's pipes closed
    under the call, or the deadline passed (both: it may have run), else the upstream's
    JSON-RPC refusal."""
    key = upstream_key(claim)
    try:
        return await send()
    except TimeoutError as exc:
        gave_up = OutcomeUnknown(tool=name, key=key, attempts=1, last_error=exc, reason="deadline")
        raise lost(name, claim, gave_up, stdio=True) from exc
    except MCPError as exc:
        if exc.code != CONNECTION_CLOSED:
            raise refused(name, claim, exc) from exc
        # The child died under the call: it may have run (the next call goes to the
        # session that replaces it).
        gave_up = OutcomeUnknown(tool=name, key=key, attempts=1, last_error=exc, reason="attempts")
        raise lost(name, claim, gave_up, stdio=True) from exc


@contextmanager
def _entered(server: FastMCP[Any], tool: OnceProxyTool) -> Iterator[None]:
    """The guarded tool entered, as FastMCP's core run enters it: its tool span, labelled with
    `tool.get_span_attributes()`, which is also FastMCP's seam for "the tool is entered"
    (`idempotency`'s body watch reads it: from here on a failure may follow an effect).

    With no OpenTelemetry SDK configured (the API's proxy provider), FastMCP's `server_span`
    would build the span's attributes and then start, on the API's no-op tracer, the very
    non-recording span the request already carries (the no-op tracer hands back its parent),
    so nothing a caller or the upstream can see changes; only the seam is kept then (~20 µs of
    CPU per call: benchmarks/README.md, issue 46)."""
    if isinstance(get_tracer_provider(), ProxyTracerProvider):
        tool.get_span_attributes()
        yield
        return
    with server_span(
        f"tools/call {tool.name}", "tools/call", server.name, "tool", tool.name, tool_name=tool.name
    ) as span:
        span.set_attributes(tool.get_span_attributes())
        yield
