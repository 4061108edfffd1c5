"""The proxy's link to its one upstream: where it is, one session shared by every call, and how a
failed call is classified.

The link is the client library's own `RetryingSession` (never a second classifier): a call that
provably never reached the upstream (no child, the child dead before the write, connection refused)
is re-sent on a fresh session within the deadline, and what is left of it is `NotExecuted`; a call
that may have run (the child died mid-call, the stream broke) is `OutcomeUnknown`; the upstream's
own JSON-RPC error is a `ToolCallError`. The upstream's annotations are not trusted
(`trust_annotations=False`): a maybe-executed call is re-sent only where the proxy's policy says
the upstream tool is idempotent (`call(..., resend=True)`), under the same key.

Over HTTP, one session per protocol era, each opened on first use and reused across calls: a
2025-era caller's calls go to a handshake session, whose server-to-client requests can be relayed;
a 2026-07-28 caller's (and the listing with no caller) to a 2026-07-28 one, in which an upstream
tool can answer with an input-required round (SEP-2322), which the handshake era cannot carry: a
guarded call's round is returned to its caller (`call`), whose answers come back as the
continuation under the same key. A third, opened on first use, declares the tasks extension
(SEP-2663, `orchestrator.TasksExtension`) in its requests' capabilities: a caller's call that
declared it goes upstream on it (`call(..., task=True)`), and so do the task's requests; no other
call does, so an upstream never tasks a caller's call that did not ask for a task.
Over stdio, one handshake session and one child (started once, and again only after it died): a
second child would split a stateful server's state between callers of the two eras, a worse
surprise than a round that does not pass. FastMCP's listing reads through the same connected
`fastmcp.Client` the calls of that era use. What the
upstream sends besides answers (log lines, sampling, elicitation, roots) goes to the caller of the
call in flight (`forwarding.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
from mcp_types import CallToolResult, InputRequiredResult, Request
from pydantic import BaseModel, TypeAdapter

from mcp_once._upstream import Upstream
from mcp_once._upstream.early import EarlyChild, child_env
from orchestrator import (
    OutcomeUnknown,
    ReconnectFailed,
    RetryingSession,
    RetryPolicy,
    TaskCreated,
    TasksExtension,
    http_client_factory,
    session_gone,
    tool_session,
)

from .failures import UpstreamUnreachable
from .forwarding import Forwarding
from .pooled import DrainingTransport

T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)

#: A task request's answer as it came (the session still checks it against the wire schema).
_RAW: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])

if TYPE_CHECKING:
    import httpx2
    from fastmcp import Client
    from fastmcp.client.transports import ClientTransport
    from mcp.shared.dispatcher import ProgressFnT
    from mcp_types import InputResponses, RequestParamsMeta


class UpstreamStartFailed(RuntimeError):
    """A stdio upstream's command could not be started as the proxy starts (no such command, it
    exits before its handshake): bad input, which no waiting mends, so the proxy does not serve.
    (An HTTP upstream not reachable yet is no such failure: the proxy serves and tries again.)"""


def transport(upstream: Upstream, early: EarlyChild | None = None) -> ClientTransport:
    """A fresh FastMCP transport to `upstream` (a new child for stdio; `early`'s, if it is still
    waiting: `adopted.py`)."""
    from fastmcp.client.transports import StdioTransport, StreamableHttpTransport

    if upstream.url is not None:
        # On the client library's retry-aware HTTP client, which notes whether a request was
        # sent: a refused connection is then "never sent" (released, re-sent), not "maybe
        # executed" (UNKNOWN), which is all a failed POST can say without it.
        return StreamableHttpTransport(
            upstream.url, headers=dict(upstream.headers), httpx_client_factory=_http_client
        )
    # Every stdio child starts through `adopted`'s spawn, which notes it (`early.started`).
    from .adopted import AdoptingTransport

    command, *args = upstream.command
    # The child's environment is `child_env`'s; its stderr is ours (log_file=None).
    env = child_env(upstream)
    if early is not None and not early.taken:
        return AdoptingTransport(early, command, args, env=env, cwd=upstream.cwd, keep_alive=False)
    return StdioTransport(command, args, env=env, cwd=upstream.cwd, keep_alive=False)


def _http_client(
    headers: dict[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
    *,
    follow_redirects: bool = True,
) -> httpx2.AsyncClient:
    """`http_client_factory` in the shape FastMCP's HTTP transport calls a factory (it passes
    `follow_redirects`, as the SDK's own client sets it), on a transport that keeps an SSE
    answer's connection for the next call (`pooled.py`)."""
    client = http_client_factory(headers, timeout, auth, inner=DrainingTransport())
    client.follow_redirects = follow_redirects
    return client


class UpstreamLink:
    """One live session to the upstream, replaced when it dies, shared by listing and calls.

    Enter it (`async with`) for as long as the proxy serves."""

    def __init__(self, upstream: Upstream, retry: RetryPolicy | None = None) -> None:
        self.upstream = upstream
        self.retry = retry or RetryPolicy(trust_annotations=False)
        if self.retry.trust_annotations:
            raise ValueError("the proxy's retry policy must not trust the upstream's annotations")
        self._session = RetryingSession(connect=self._connect, policy=self.retry)
        #: The 2026-07-28 era's session, opened on its first use (HTTP upstreams only).
        self._modern = RetryingSession(connect=self._connect_modern, policy=self.retry)
        #: The 2026-07-28 session that declares the tasks extension (HTTP upstreams only).
        self._tasks = RetryingSession(connect=self._connect_tasks, policy=self.retry)
        #: The calls in flight, to which the upstream's log lines and requests are forwarded.
        self.forwarding = Forwarding()
        #: A stdio child started before the proxy's imports, for the first session (`adopt`).
        self._early: EarlyChild | None = None

    def adopt(self, child: EarlyChild | None) -> None:
        """Open the first stdio session on `child`, already started (`mcp_once._upstream.early`:
        `mcp-once proxy` starts it before importing FastMCP), instead of starting one."""
        self._early = child

    def _connect(self) -> Client[Any]:
        from fastmcp.server.providers.proxy import ProxyClient

        return ProxyClient(transport(self.upstream, self._early), **self._client_options())

    def _connect_modern(self) -> Client[Any]:
        """The 2026-07-28 era's session ("auto": the handshake on an upstream without it, where
        the forwarding handlers relay as on the handshake session)."""
        from fastmcp.server.providers.proxy import ProxyClient

        return ProxyClient(transport(self.upstream), mode="auto", **self._client_options())

    def _connect_tasks(self) -> Client[Any]:
        """The session a task is created and polled on: the 2026-07-28 one's, declaring the
        tasks extension (on an upstream without 2026-07-28 it declares nothing: no tasks)."""
        from fastmcp.server.providers.proxy import ProxyClient

        options = self._client_options()
        return ProxyClient(
            transport(self.upstream), mode="auto", extensions=[TasksExtension()], **options
        )

    def _client_options(self) -> dict[str, Any]:
        """What each upstream session is opened with: our forwarding handlers, and none of the
        caller's headers. FastMCP's `ProxyClient` copies the headers of the request that opens
        the session (`Authorization` and cookies included) onto it, and the session is shared
        by every caller: the first caller's token would reach the upstream, and speak for
        everyone after it. No token passthrough: the upstream gets the proxy's own credentials
        only (the upstream's `headers`, a stdio child's `env`)."""
        return {**self.forwarding.client_options(), "forward_incoming_headers": False}

    @property
    def connects(self) -> int:
        """Upstream sessions opened so far, every era's and the tasks one (one per stdio
        child)."""
        return self._session.connects + self._modern.connects + self._tasks.connects

    async def __aenter__(self) -> UpstreamLink:
        await self._session.__aenter__()
        await self._modern.__aenter__()
        await self._tasks.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._tasks.__aexit__(*exc_info)
        await self._modern.__aexit__(*exc_info)
        await self._session.__aexit__(*exc_info)

    def _era(self) -> RetryingSession:
        """The session of the caller's era: the handshake one for a 2025-era front request (whose
        sampling/elicitation/roots requests it relays), else the 2026-07-28 one (it answers
        input-required rounds; "auto" falls back to the handshake on an older upstream). Without
        a request (the start-up listing, `mcp-once tools`) the modern one. Over stdio always the
        handshake one: one child, whose state every caller shares. The request is FastMCP's bound
        request context, there with or without a FastMCP `Context` (the fast path enters none)."""
        if self.upstream.url is None:
            return self._session
        from fastmcp.server.dependencies import fastmcp_request_ctx

        rc = fastmcp_request_ctx.get()
        if rc is None or _modern(rc.protocol_version):
            return self._modern
        return self._session

    def raw_ready(self, protocol_version: str | None) -> bool:
        """Whether a call from a caller speaking `protocol_version` can be sent raw now (the
        fast path, `fast_path.py`): over stdio, while the sessions opened so far are alive; over
        HTTP, for a handshake-era caller whose era's session is open and its session task
        running (a 2026-07-28 caller's call carries what only the SDK's typed `call_tool` sends:
        its input-required rounds and `Mcp-Param-*` headers)."""
        if self.upstream.url is None:
            return self.alive()
        if _modern(protocol_version):
            return False
        current = self._session.session
        return current is not None and not tool_session(current).closed()

    def tasks(self) -> RetryingSession:
        """The session a task is created and polled on: the one declaring the extension (over
        stdio the one session: no task was created there, the upstream answers so)."""
        return self._session if self.upstream.url is None else self._tasks

    def alive(self) -> bool:
        """Whether the sessions opened so far can all still send (False before the first
        connect, and once the SDK has seen a stdio child's pipes close)."""
        opened = False
        for era in (self._session, self._modern, self._tasks):
            current = era.session
            if current is not None:
                if tool_session(current).closed():
                    return False
                opened = True
        return opened

    async def client(self) -> Client[Any]:
        """The connected `fastmcp.Client` of the current session, reconnecting a dead one.

        Raises `UpstreamUnreachable` (a retryable JSON-RPC error, as FastMCP passes it on to
        whoever listed) when no session can be opened: the next listing or call tries again."""
        return await self._connected(self._era())

    async def _connected(self, era: RetryingSession) -> Client[Any]:
        """`era`'s connected `fastmcp.Client` (see `client`): each of the link's sessions is
        one (`_connect` and its siblings)."""
        try:
            current = await era.live_session()
        except ReconnectFailed as exc:
            raise UpstreamUnreachable() from exc
        return cast("Client[Any]", current)

    async def call(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        key: str,
        *,
        resend: bool,
        progress: ProgressFnT | None = None,
        input_responses: InputResponses | None = None,
        request_state: str | None = None,
        task: bool = False,
    ) -> CallToolResult | InputRequiredResult | TaskCreated:
        """Call `name` upstream under `key` (in `_meta`, the same on every re-send).

        With `task` (a caller's request that declared the tasks extension, `tasks.py`) the call
        goes upstream on the session that declares it (over HTTP; over stdio it is a plain
        call), and the upstream's `TaskCreated` is returned (or its `CallToolResult`, if it ran
        the call as a plain one, or its `InputRequiredResult`: an upstream may ask before it
        creates the task, and the caller's continuation goes with the creation).

        On the 2026-07-28 era's session the caller's continuation of an input-required round
        (`input_responses`, `request_state`: None on its first call) goes with the call, and the
        upstream's `InputRequiredResult` is returned as it came, for the caller to answer; on the
        handshake era's the call is a plain one (the upstream asks by server-to-client requests,
        relayed to the caller).

        Raises `NotExecuted` (never reached the upstream), `OutcomeUnknown` (may have run; with
        `resend`, only once the deadline is spent), `ToolCallError` (the upstream's refusal)."""
        era = self._era()
        rounds = era is self._modern
        task = task and self.upstream.url is not None
        progress = progress or _unasked
        deadline = anyio.current_time() + self.retry.deadline
        while True:
            try:
                if task:
                    return await self._tasks.create_task(
                        name,
                        arguments,
                        progress_callback=progress,
                        idempotency_key=key,
                        input_responses=input_responses,
                        request_state=request_state,
                        allow_input_required=True,
                    )
                return await era.call_tool(
                    name,
                    arguments,
                    progress_callback=progress,
                    idempotency_key=key,
                    input_responses=input_responses if rounds else None,
                    request_state=request_state if rounds else None,
                    allow_input_required=rounds,
                )
            except OutcomeUnknown as exc:
                # Only the proxy's policy may open this gate: the upstream tool runs twice safely.
                if not resend or exc.reason == "server" or anyio.current_time() >= deadline:
                    raise

    async def pass_task(
        self,
        name: str,
        arguments: dict[str, Any],
        meta: RequestParamsMeta | None,
        *,
        schema: dict[str, Any] | None = None,
        progress: ProgressFnT | None = None,
        input_responses: InputResponses | None = None,
        request_state: str | None = None,
    ) -> CallToolResult | InputRequiredResult | TaskCreated:
        """A call the proxy does not claim (pass-through, keyless), from a caller whose request
        declared the tasks extension: sent once, as FastMCP's proxy sends a call (the caller's
        forwardable `_meta`, its round), but on the session that declares the extension too,
        so the upstream may task it; its answer as it came (a task is not polled here: it is
        the caller's). Over stdio (no tasks) the caller gets FastMCP's plain call instead
        (`OnceProxyTool.run`). `schema`: the tool's input schema, whose `x-mcp-header`
        arguments the SDK mirrors into `Mcp-Param-*` headers (as FastMCP's proxy seeds them: a
        2026-07-28 upstream refuses the call without them). Sent once more on a new session if
        the upstream no longer knows that one (`once_more_if_gone`: against an upstream of the
        handshake era only, that session is a handshake one, which a restart forgets)."""
        from mcp.shared.inbound import x_mcp_header_map

        header_map = x_mcp_header_map(schema or {})

        async def send() -> Any:
            client = await self._connected(self._tasks)
            if header_map:
                client.session._x_mcp_header_maps[name] = header_map
            return await client._await_with_session_monitoring(
                client.session.call_tool(
                    name,
                    arguments,
                    meta=meta,
                    progress_callback=progress,
                    input_responses=input_responses,
                    request_state=request_state,
                    allow_input_required=True,
                    allow_claimed=True,
                )
            )

        answer = await self.once_more_if_gone(send, self._tasks)
        if isinstance(answer, TaskCreated | CallToolResult | InputRequiredResult):
            return answer
        raise TypeError(f"the upstream answered {name!r} with a {type(answer).__name__}")

    async def task_request(self, request: Request[Any, Any]) -> dict[str, Any]:
        """Send a request that changes a task (`tasks/update`, `tasks/cancel`) once, on the
        session a task is created on; the upstream's answer as it came (SEP-2663 answers both
        with an empty acknowledgement, a server may add the task's fields). A session that
        died under it is the retryable -32013 (both are safe to send again: an answer already
        given, a task already cancelled, is acknowledged again)."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        client = await self._connected(self.tasks())
        try:
            return await self.send_raw(client, request)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                raise UpstreamUnreachable() from exc
            raise

    async def forward(
        self, request: Request[Any, Any], progress: ProgressFnT | None = None
    ) -> dict[str, Any]:
        """`request` sent once on the session of the caller's era, its answer as it came
        (`send_raw`; its progress to `progress`), or once more on a new session if the upstream
        no longer knows that one (`once_more_if_gone`)."""

        era = self._era()  # once per call: `send` and the re-send read the same one

        async def send() -> dict[str, Any]:
            return await self.send_raw(await self._connected(era), request, progress)

        return await self.once_more_if_gone(send, era)

    async def once_more_if_gone(
        self, send: Callable[[], Awaitable[T]], era: RetryingSession | None = None
    ) -> T:
        """`send()`, a request sent on the current session of `era` (by default the caller's
        era's) outside its retrying call (a raw forward, FastMCP's own run of a pass-through);
        if the upstream no longer knows that session (it restarted: HTTP 404, refused before it
        was dispatched, so nothing ran), sent once more on a new one. Only the retrying call
        replaces a session the upstream forgot: without this every call outside it would fail
        "Session not found" until a guarded call opened a new session."""
        from mcp import MCPError

        era = era if era is not None else self._era()
        before = era.session
        try:
            return await send()
        except MCPError as exc:
            if before is None or not session_gone(exc):
                raise
        era.discard(before)
        return await send()

    def discard(self, client: Client[Any]) -> None:
        """`client` (one of this link's sessions) was refused a request sent on it directly
        because the upstream no longer knows it (`orchestrator.session_gone`): the next call on
        it opens a new session first, instead of asking the forgotten one again."""
        for era in (self._session, self._modern, self._tasks):
            era.discard(client)

    async def send_raw(
        self,
        client: Client[Any],
        request: Request[Any, Any],
        progress: ProgressFnT | None = None,
    ) -> dict[str, Any]:
        """`request` sent once on `client` (one of this link's), its answer as it came (the
        session still checks it against the wire schema: `sent`)."""
        answer = await self.sent(client, request, cast(Any, _RAW), progress)
        return cast(dict[str, Any], answer)

    async def sent(
        self,
        client: Client[Any],
        request: Request[Any, Any],
        answer: type[R],
        progress: ProgressFnT | None = None,
    ) -> R:
        """`request` sent once on `client` (one of this link's), its answer read as `answer` by
        the session. Over HTTP under the client's watch on its session task, as FastMCP's client
        sends every call: there a server's failure can end that task instead of the request,
        which would otherwise wait for an answer that never comes. Over stdio the pipes' end
        fails the request itself (-32000). `progress` gets the upstream's progress
        notifications for it (the session then sends a progress token of its own)."""
        sending = client.session.send_request(request, answer, progress_callback=progress)
        if self.upstream.url is None:
            return await sending
        return await client._await_with_session_monitoring(sending)


async def _unasked(progress: float, total: float | None, message: str | None) -> None:
    """Where the progress of a call whose caller asked for none goes: nowhere. `call` never
    sends None: FastMCP's client replaces it by its own handler, on the link's `ProxyClient`
    one that relays to the request FastMCP's own proxy run last stashed on the shared client,
    another caller's, long answered (so the upstream is asked for progress all the same)."""


def _modern(protocol_version: str | None) -> bool:
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    return protocol_version in MODERN_PROTOCOL_VERSIONS
