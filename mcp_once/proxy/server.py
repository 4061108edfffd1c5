"""`build_proxy`: a FastMCP proxy server with the guard in front of one upstream's tools.

What `mcp-once proxy` runs, and the Python API beside it: the result is a plain `FastMCP`
server, so a user adds middleware of their own (`server.add_middleware`), mounts it, or runs it on
any transport FastMCP serves. Its HTTP front takes FastMCP's `auth=` (`auth.py`) and bounds
request bodies and each principal's calls in flight (`limits.py`).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import mcp_types
from fastmcp import FastMCP
from fastmcp.server.auth import AuthProvider
from fastmcp.server.http import StarletteWithLifespan
from fastmcp.server.middleware import CallNext, MiddlewareContext
from fastmcp.server.providers.proxy import ProxyMetadataMiddleware, ProxyProvider
from fastmcp.tools.base import Tool
from starlette.middleware import Middleware

from idempotency import KeyStore
from mcp_once._limits import DEFAULT_MAX_BODY, DEFAULT_MAX_IN_FLIGHT
from mcp_once._upstream import Upstream
from orchestrator import RetryPolicy

from . import fast_path, seam
from .completions import forward_completions
from .failures import UpstreamUnreachable
from .http_front import held_front
from .limits import BodyLimit, InFlightLimit
from .lookup import in_turn, looked_up, own_providers
from .middleware import ProxyGuardMiddleware
from .policy import ProxyPolicy
from .stdio_front import stdio_front
from .task_owners import TaskOwners
from .tasks import TaskForwarding
from .tools import OnceProxyProvider
from .upstream import UpstreamLink, UpstreamStartFailed

logger = logging.getLogger("mcp_once.proxy")


class LinkedServer(FastMCP[Any]):
    """A FastMCP server with upstream links to keep open while it serves (`OnceProxy`, and
    `OnceGateway` in front of several). `run_async` (what `run` and the CLI use) opens them for
    the run; to serve it some other way (an in-memory `Client(server)`, an ASGI app), open them
    first: `async with server.opened():`. (Not `async with server:` itself: the SDK's `Client`
    takes an async context manager for a transport, and would mistake the server for one.)
    They are not opened in FastMCP's lifespan because FastMCP closes lifespans inside a cancel
    scope of its own, which a task group (a link's session host) cannot be closed in; the
    lifespan only refuses to serve while they are closed."""

    def __init__(self, *, max_body: int | None = DEFAULT_MAX_BODY, **settings: Any) -> None:
        super().__init__(lifespan=_links_open, **settings)
        self._open = False
        #: The bound of an HTTP request's body (`limits.BodyLimit`; None: none).
        self.max_body = max_body

    def opened(self) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    @property
    def open(self) -> bool:
        return self._open

    def http_app(  # type: ignore[override]  # its own parameters, passed on
        self, path: str | None = None, middleware: list[Middleware] | None = None, **kwargs: Any
    ) -> StarletteWithLifespan:
        """FastMCP's HTTP app, its request bodies bounded by `max_body`: after the Host/Origin
        check, before anything reads the body (the transport, OAuth routes); a request's answer
        sent as JSON when it comes first (`http_front`)."""
        bounded = [] if self.max_body is None else [Middleware(BodyLimit, max_bytes=self.max_body)]
        return held_front(super().http_app(path, [*bounded, *(middleware or [])], **kwargs))

    async def run_async(self, *args: Any, **kwargs: Any) -> None:
        if self._open:
            await super().run_async(*args, **kwargs)
            return
        async with self.opened():
            await super().run_async(*args, **kwargs)

    async def run_stdio_async(
        self, show_banner: bool = True, log_level: str | None = None, stateless: bool = False
    ) -> None:
        """FastMCP's stdio run on the proxy's own stdio transport (`stdio_front`: no worker
        thread per line read or message written), everything else as FastMCP's `run_stdio_async`
        does it (its banner, log level, transport name and lifespan). FastMCP takes no transport
        for stdio, so its low-level server is run here on the front's streams."""
        from fastmcp.server.context import reset_transport, set_transport
        from fastmcp.utilities.logging import temporary_log_level

        if show_banner:
            from fastmcp.utilities.cli import log_server_banner

            log_server_banner(server=self)
        token = set_transport("stdio")
        try:
            with temporary_log_level(log_level):
                async with self._lifespan_manager(), stdio_front() as (read_stream, write_stream):
                    logger.debug("serving %r on stdio%s", self.name, " (stateless)" * stateless)
                    low = self._mcp_server
                    await low.run(read_stream, write_stream, low.create_initialization_options())
        finally:
            reset_transport(token)


@asynccontextmanager
async def _links_open(served: FastMCP[Any]) -> AsyncIterator[dict[str, Any]]:
    assert isinstance(served, LinkedServer)
    if not served.open:
        raise RuntimeError(
            f"the upstream links of {served.name!r} are not open: serve it with run/run_async,"
            " or enter it first (async with server.opened():)"
        )
    yield {}


class OnceProxy(LinkedServer):
    """The proxy server: FastMCP's, with its upstream link to keep open while it serves
    (`LinkedServer`).

    Opening lists the upstream once. A stdio upstream that cannot be started raises
    `UpstreamStartFailed` (bad input: nothing to serve), unless started with `required=False` (one
    upstream among several on one front, `gateway.py`): then it is kept in `start_failed` and
    served as one that cannot be reached. An HTTP upstream that cannot be reached
    yet (a fleet restarting, a deploy, compose starting services in any order) is logged and the
    proxy serves: listings and calls answer the retryable `UpstreamUnreachable` until it is back,
    and the next one after that works, with no restart.
    """

    def __init__(
        self,
        link: UpstreamLink,
        provider: ProxyProvider,
        **settings: Any,
    ) -> None:
        super().__init__(**settings)
        self.link = link
        self.provider = provider
        # An upstream failure reaches whoever listed or called, as the retryable error it is,
        # instead of FastMCP's default: a warning, an empty listing and "Unknown tool".
        self.provider_error_strategy = "raise"
        #: Policy patterns that matched no upstream tool at the first successful listing.
        self.unmatched: list[str] = []
        #: Why the stdio upstream could not be started as the proxy opened (`required=False`).
        self.start_failed: UpstreamStartFailed | None = None

    async def get_tool(self, name: str, version: Any = None) -> Tool | None:
        """FastMCP's lookup, asked once per `tools/call` (`lookup.looked_up`)."""
        return await looked_up(name, version, super().get_tool)

    async def _get_tool(self, name: str, version: Any = None) -> Tool | None:
        """FastMCP's, with the proxy's own two providers asked in turn instead of in a task group
        per call (`lookup.in_turn`); FastMCP's own where a user added providers of theirs."""
        if own_providers(self, self.provider):
            return await in_turn(self, name, version)
        return await super()._get_tool(name, version)

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[OnceProxy]:
        """The proxy with its upstream link open, for the block."""
        async with self.linked():
            await self.start()
            yield self

    @asynccontextmanager
    async def linked(self) -> AsyncIterator[OnceProxy]:
        """The upstream link open for the block; the proxy serves once `start` has run (what
        `opened` does; a gateway starts its upstreams' proxies all at once)."""
        async with self.link:
            try:
                yield self
            finally:
                self._open = False

    async def start(self, *, required: bool = True) -> None:
        """List the upstream once (the link open), then serve."""
        try:
            await self._first_listing()
        except UpstreamStartFailed as exc:
            if required:
                raise
            self.start_failed = exc
        self._open = True

    async def _first_listing(self) -> None:
        upstream = self.link.upstream
        try:
            await self.provider.list_tools()
        except UpstreamUnreachable as exc:
            reason = exc.__cause__ or exc
            if upstream.command:
                raise UpstreamStartFailed(
                    f"the upstream command {upstream.command[0]!r} could not be started"
                    f" ({' '.join(upstream.command)}): {reason}"
                ) from exc
            logger.warning(
                "the upstream %s cannot be reached yet (%s): serving; listings and calls answer"
                " -32013 (retry later) until it can",
                upstream.url,
                reason,
            )


def build_proxy(
    upstream: Upstream,
    store: KeyStore,
    *,
    policy: ProxyPolicy | None = None,
    retry: RetryPolicy | None = None,
    name: str | None = None,
    on_listing: Callable[[dict[str, dict[str, Any]]], None] | None = None,
    auth: AuthProvider | None = None,
    max_in_flight: int | None = DEFAULT_MAX_IN_FLIGHT,
    max_body: int | None = DEFAULT_MAX_BODY,
    unmatched: Callable[[list[str], list[str]], None] | None = None,
    **options: Any,
) -> OnceProxy:
    """A FastMCP server proxying `upstream`, its tools guarded on `store`.

    `policy` sets per-tool behaviour (see `policy.py`; the tables of `upstream`'s own
    `[servers."<name>"]` section apply with the plain ones); `options` are
    `IdempotencyMiddleware`'s (the defaults of every guarded tool: `key_header="Idempotency-Key"`
    for HTTP fronts, `lease`, `wait`, ...); `retry` bounds re-sends to the upstream (it must not
    trust annotations).

    `auth`: who may call the HTTP front (any FastMCP `AuthProvider`: `token_file_auth`,
    `jwt_auth`, or one of FastMCP's); each authenticated principal's records are its own.
    `max_in_flight` bounds each principal's calls running at once (-32013 past it) and
    `max_body` an HTTP request's body (413 past it); None lifts a bound (`limits.py`).

    The policy's options are checked here (a bad one raises). At the first listing that
    succeeds (as the proxy opens, or later if the upstream could not be reached then) every
    listed tool's guard is built, and the policy patterns that match no tool are kept in
    `unmatched` and passed to `unmatched(patterns, names)` with the listed names (by default
    each logged as a warning, with the nearest tool name).

    `on_listing` is called with the output schemas of the listed tools (by name; tools without
    one left out) at the first listing and whenever the listing changes: the CLI keeps them in
    the proxy's manifest, so that `keys settle --proxy NAME` can check a result against them."""
    link = UpstreamLink(upstream, retry)
    guard = ProxyGuardMiddleware(
        store, (policy or ProxyPolicy()).for_server(upstream.name), **options
    )
    guard.settle_with = f" --proxy {upstream.identity.name}@{upstream.identity.id}"
    server: OnceProxy | None = None

    def warn_unmatched(patterns: list[str], names: list[str]) -> None:
        for pattern in patterns:
            logger.warning("%s", guard.policy.said_unmatched(pattern, names))

    report = unmatched or warn_unmatched

    def first_listing(names: list[str]) -> None:
        found = guard.check(names)
        report(found, names)
        if server is not None:
            server.unmatched = found

    provider = OnceProxyProvider(link, guard.resend, first_listing, on_listing)

    # The upstream's schemas are listed as it wrote them: FastMCP's default inlines `$ref`s and
    # drops `$defs` (and the `$anchor`s in them), which a proxy has no business changing.
    # The server's name is what the guard scopes records by: the upstream's name and identity
    # (`identity.py`), so two upstreams never answer each other's calls on one store.
    server = OnceProxy(
        link,
        provider,
        name=name or upstream.identity.server,
        version=_VERSION,
        dereference_schemas=False,
        auth=auth,
        max_body=max_body,
    )
    server.add_provider(provider)
    guard.task_owners = TaskOwners(store, server.name)
    server.add_extension(TaskForwarding(link, guard.task_owners))
    forward_completions(server, link)
    limit = None if max_in_flight is None else InFlightLimit(max_in_flight)
    if limit is not None:
        # Outside the guard: a call refused for its caller's load is never claimed.
        server.add_middleware(limit)
    server.add_middleware(guard)
    server.add_middleware(UpstreamMetadata(provider, server.name))
    fast_path.install(server, link, guard, limit)
    seam.install(server)
    return server


def _version() -> str:
    try:
        return importlib.metadata.version("mcp-once")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a bare tree
        return "0"


#: mcp-once's version: the front's `serverInfo.version` while the upstream cannot be reached.
_VERSION = _version()


class UpstreamMetadata(ProxyMetadataMiddleware):
    """FastMCP's metadata forwarding with the upstream's identity: the front's `serverInfo` is
    the upstream's name and version (a client shows and logs the server it uses), with the proxy
    named in its `title` ("server-memory via mcp-once proxy: memory@..."), and the upstream's
    instructions. A front session still opens while the upstream cannot be reached: with the
    proxy's own `serverInfo` and no instructions, then. (FastMCP's asks the provider for its
    client first, which for this proxy means connecting.)"""

    def __init__(self, provider: ProxyProvider, proxy: str) -> None:
        super().__init__(provider, identity="upstream")
        self.proxy = proxy

    async def _read_upstream(self, client: Any, context: Any) -> Any:
        found = await super()._read_upstream(client, context)
        if found is None or found.server_info is None:
            return found
        info = found.server_info
        title = f"{info.title or info.name} via {self.proxy}"
        return dataclasses.replace(found, server_info=info.model_copy(update={"title": title}))

    async def _reachable(self) -> bool:
        try:
            await self.provider._get_client()
        except UpstreamUnreachable:
            return False
        return True

    async def on_initialize(
        self,
        context: MiddlewareContext[mcp_types.InitializeRequest],
        call_next: CallNext[mcp_types.InitializeRequest, mcp_types.InitializeResult | None],
    ) -> mcp_types.InitializeResult | None:
        if not await self._reachable():
            return await call_next(context)
        return await super().on_initialize(context, call_next)

    async def on_discover(
        self,
        context: MiddlewareContext[mcp_types.DiscoverRequest],
        call_next: CallNext[mcp_types.DiscoverRequest, mcp_types.DiscoverResult | dict[str, Any]],
    ) -> mcp_types.DiscoverResult | dict[str, Any]:
        if not await self._reachable():
            return await call_next(context)
        return await super().on_discover(context, call_next)
