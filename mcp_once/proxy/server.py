"""`build_proxy`: a FastMCP proxy server with the guard in front of one upstream's tools.

What `mcp-once proxy` runs, and the Python API beside it: the result is a plain `FastMCP`
server, so a user adds middleware of their own (`server.add_middleware`), mounts it, or runs it on
any transport FastMCP serves.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.providers.proxy import ProxyMetadataMiddleware

from idempotency import KeyStore
from orchestrator import RetryPolicy

from .completions import forward_completions
from .middleware import ProxyGuardMiddleware
from .policy import ProxyPolicy
from .tools import OnceProxyProvider
from .upstream import Upstream, UpstreamLink

logger = logging.getLogger("mcp_once.proxy")


class OnceProxy(FastMCP[Any]):
    """The proxy server: FastMCP's, with its upstream link to keep open while it serves.

    `run_async` (what `run` and the CLI use) opens the link for the run. To serve it some other
    way (an in-memory `Client(proxy)`, an ASGI app), open it first: `async with proxy.opened():`.
    (Not `async with proxy:` itself: the SDK's `Client` takes an async context manager for a
    transport, and would mistake the server for one.)
    The link is not opened in FastMCP's lifespan because FastMCP closes lifespans inside a
    cancel scope of its own, which a task group (the link's session host) cannot be closed in.
    """

    def __init__(self, link: UpstreamLink, **settings: Any) -> None:
        super().__init__(**settings)
        self.link = link
        self._open = False
        #: Policy patterns that matched no upstream tool at the last start.
        self.unmatched: list[str] = []

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[OnceProxy]:
        """The proxy with its upstream link open, for the block."""
        async with self.link:
            self._open = True
            try:
                yield self
            finally:
                self._open = False

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
    **options: Any,
) -> OnceProxy:
    """A FastMCP server proxying `upstream`, its tools guarded on `store`.

    `policy` sets per-tool behaviour (see `policy.py`); `options` are `IdempotencyMiddleware`'s
    (the defaults of every guarded tool: `key_header="Idempotency-Key"` for HTTP fronts, `lease`,
    `wait`, ...); `retry` bounds re-sends to the upstream (it must not trust annotations).

    On start (the server's lifespan) the upstream is listed once: every tool's guard options are
    checked (a bad one raises), and a policy pattern that matches no tool is logged as a warning
    and kept in `unmatched`."""
    link = UpstreamLink(upstream, retry)
    guard = ProxyGuardMiddleware(store, policy, **options)
    provider = OnceProxyProvider(link, guard.resend)

    @asynccontextmanager
    async def lifespan(server: FastMCP[Any]) -> AsyncIterator[dict[str, Any]]:
        assert isinstance(server, OnceProxy)
        if not server.open:
            raise RuntimeError(
                "the proxy's upstream link is not open: serve it with run/run_async, or enter it"
                " first (async with proxy.opened():)"
            )
        tools = await provider.list_tools()
        server.unmatched = guard.check([t.name for t in tools])
        for pattern in server.unmatched:
            logger.warning("policy pattern %r matches no tool of the upstream", pattern)
        yield {}

    # The upstream's schemas are listed as it wrote them: FastMCP's default inlines `$ref`s and
    # drops `$defs` (and the `$anchor`s in them), which a proxy has no business changing.
    server = OnceProxy(
        link,
        name=name or f"mcp-once proxy: {upstream.name}",
        lifespan=lifespan,
        dereference_schemas=False,
    )
    server.add_provider(provider)
    forward_completions(server, link)
    server.add_middleware(guard)
    server.add_middleware(ProxyMetadataMiddleware(provider, identity="proxy"))
    return server
