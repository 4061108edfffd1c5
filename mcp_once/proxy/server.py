"""`build_proxy`: a FastMCP proxy server with the guard in front of one upstream's tools.

What `mcp-once proxy` runs, and the Python API beside it: the result is a plain `FastMCP`
server, so a user adds middleware of their own (`server.add_middleware`), mounts it, or runs it on
any transport FastMCP serves.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import mcp_types
from fastmcp import FastMCP
from fastmcp.server.middleware import CallNext, MiddlewareContext
from fastmcp.server.providers.proxy import ProxyMetadataMiddleware, ProxyProvider

from idempotency import KeyStore
from mcp_once._upstream import Upstream
from orchestrator import RetryPolicy

from .completions import forward_completions
from .failures import UpstreamUnreachable
from .middleware import ProxyGuardMiddleware
from .policy import ProxyPolicy
from .tools import OnceProxyProvider
from .upstream import UpstreamLink, UpstreamStartFailed

logger = logging.getLogger("mcp_once.proxy")


class OnceProxy(FastMCP[Any]):
    """The proxy server: FastMCP's, with its upstream link to keep open while it serves.

    `run_async` (what `run` and the CLI use) opens the link for the run. To serve it some other
    way (an in-memory `Client(proxy)`, an ASGI app), open it first: `async with proxy.opened():`.
    (Not `async with proxy:` itself: the SDK's `Client` takes an async context manager for a
    transport, and would mistake the server for one.)
    The link is not opened in FastMCP's lifespan because FastMCP closes lifespans inside a
    cancel scope of its own, which a task group (the link's session host) cannot be closed in.

    Opening lists the upstream once. A stdio upstream that cannot be started raises
    `UpstreamStartFailed` (bad input: nothing to serve). An HTTP upstream that cannot be reached
    yet (a fleet restarting, a deploy, compose starting services in any order) is logged and the
    proxy serves: listings and calls answer the retryable `UpstreamUnreachable` until it is back,
    and the next one after that works, with no restart.
    """

    def __init__(self, link: UpstreamLink, provider: ProxyProvider, **settings: Any) -> None:
        super().__init__(**settings)
        self.link = link
        self.provider = provider
        # An upstream failure reaches whoever listed or called, as the retryable error it is,
        # instead of FastMCP's default: a warning, an empty listing and "Unknown tool".
        self.provider_error_strategy = "raise"
        self._open = False
        #: Policy patterns that matched no upstream tool at the first successful listing.
        self.unmatched: list[str] = []

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[OnceProxy]:
        """The proxy with its upstream link open, for the block."""
        async with self.link:
            await self._first_listing()
            self._open = True
            try:
                yield self
            finally:
                self._open = False

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

    @property
    def open(self) -> bool:
        return self._open

    async def run_async(self, *args: Any, **kwargs: Any) -> None:
        if self._open:
            await super().run_async(*args, **kwargs)
            return
        async with self.opened():
            await super().run_async(*args, **kwargs)


def build_proxy(
    upstream: Upstream,
    store: KeyStore,
    *,
    policy: ProxyPolicy | None = None,
    retry: RetryPolicy | None = None,
    name: str | None = None,
    on_listing: Callable[[dict[str, dict[str, Any]]], None] | None = None,
    **options: Any,
) -> OnceProxy:
    """A FastMCP server proxying `upstream`, its tools guarded on `store`.

    `policy` sets per-tool behaviour (see `policy.py`); `options` are `IdempotencyMiddleware`'s
    (the defaults of every guarded tool: `key_header="Idempotency-Key"` for HTTP fronts, `lease`,
    `wait`, ...); `retry` bounds re-sends to the upstream (it must not trust annotations).

    The policy's options are checked here (a bad one raises). At the first listing that
    succeeds (as the proxy opens, or later if the upstream could not be reached then) every
    listed tool's guard is built, and a policy pattern that matches no tool is logged as a
    warning and kept in `unmatched`.

    `on_listing` is called with the output schemas of the listed tools (by name; tools without
    one left out) at the first listing and whenever the listing changes: the CLI keeps them in
    the proxy's manifest, so that `keys settle --proxy NAME` can check a result against them."""
    link = UpstreamLink(upstream, retry)
    guard = ProxyGuardMiddleware(store, policy, **options)
    guard.settle_with = f" --proxy {upstream.identity.name}@{upstream.identity.id}"
    server: OnceProxy | None = None

    def first_listing(names: list[str]) -> None:
        unmatched = guard.check(names)
        for sentence in guard.policy.unmatched_said(names):
            logger.warning("%s", sentence)
        if server is not None:
            server.unmatched = unmatched

    provider = OnceProxyProvider(link, guard.resend, first_listing, on_listing)

    @asynccontextmanager
    async def lifespan(served: FastMCP[Any]) -> AsyncIterator[dict[str, Any]]:
        assert isinstance(served, OnceProxy)
        if not served.open:
            raise RuntimeError(
                "the proxy's upstream link is not open: serve it with run/run_async, or enter it"
                " first (async with proxy.opened():)"
            )
        yield {}

    # The upstream's schemas are listed as it wrote them: FastMCP's default inlines `$ref`s and
    # drops `$defs` (and the `$anchor`s in them), which a proxy has no business changing.
    # The server's name is what the guard scopes records by: the upstream's name and identity
    # (`identity.py`), so two upstreams never answer each other's calls on one store.
    server = OnceProxy(
        link,
        provider,
        name=name or upstream.identity.server,
        version=_VERSION,
        lifespan=lifespan,
        dereference_schemas=False,
    )
    server.add_provider(provider)
    forward_completions(server, link)
    server.add_middleware(guard)
    server.add_middleware(UpstreamMetadata(provider, server.name))
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
