"""`build_gateway`: many upstreams behind one front, each tool named `<server>_<tool>`.

Modelled on FastMCP's multi-server proxy (`create_proxy` of an `mcpServers` config), which mounts
one proxy per server on one router under the server's name: tools and prompts `<server>_<name>`,
resources `scheme://<server>/path`; with a single server nothing is prefixed. The gateway mounts
one `OnceProxy` per upstream (`build_proxy`) the same way, with FastMCP's own mounting, so each
upstream keeps everything a single proxy has: its own link (a child, a session), identity (the
server name its records are scoped by: a record written through the gateway is the one a single
proxy of the same entry finds), store and policy (the plain tables and its `[servers."<name>"]`
section). Its records name the upstream's own tool (`create_entities`, not
`memory_create_entities`).

Where it departs from FastMCP's, each for the guarantee:

- `tools/call` goes to the upstream's proxy (its middleware, the guard) from a middleware of the
  gateway's (`_Dispatch`), as FastMCP's mounted tool would send it, but above FastMCP's tool path,
  which turns whatever a mounted server raises into an `isError` result: the guard's JSON-RPC
  errors (-32012 outcome unknown, -32013 not run, -32010 in progress, ...) reach the caller with
  their codes, as from a single proxy.
- One upstream failing never fails the others. FastMCP's skips a server that fails to connect at
  start and never lists it again (and under `provider_error_strategy="raise"`, the setting a proxy
  that surfaces failures needs, one failing listing fails the whole front's). Here an upstream
  that cannot be reached (or answers a listing with an error) is listed as it was last listed
  (nothing, if it never was), a call of one of its tools answers -32013 (nothing ran, retry
  later), and the first listing or call that reaches it again brings it back, with no restart.
  Only when every upstream is a command that cannot be started is there nothing to serve
  (`UpstreamStartFailed`, as a single proxy's).
- `completion/complete` goes to the upstream whose prompt or resource template the reference
  names (FastMCP answers it from the front's own handler only).
- Tasks (SEP-2663): a task's id on the front is `<server>_<taskId>`, and `tasks/get`,
  `tasks/update` and `tasks/cancel` go to the upstream it names (`task_routes`); the front
  serves the extension only if an upstream may task a call (`OnceGateway._offer_tasks`).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from fastmcp.server.auth import AuthProvider
from fastmcp.server.completions import CompletionReference
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.server.providers.fastmcp_provider import FastMCPProvider
from fastmcp.tools.base import ToolResult
from mcp import MCPError
from mcp_types import (
    CallToolRequestParams,
    Completion,
    CompletionArgument,
    CompletionContext,
    PromptReference,
    ResourceTemplateReference,
)

from idempotency import KeyStore
from mcp_once._limits import DEFAULT_MAX_BODY, DEFAULT_MAX_IN_FLIGHT
from mcp_once._upstream import Upstream, UpstreamConfigError, check_names
from orchestrator import TASKS_EXTENSION, RetryPolicy

from . import seam
from .completions import complete_upstream
from .failures import UpstreamUnreachable
from .policy import ProxyPolicy
from .server import _VERSION, LinkedServer, OnceProxy, UpstreamMetadata, build_proxy
from .task_routes import TaskRoutes, created_on_front, refusal_on_front
from .upstream import UpstreamStartFailed

logger = logging.getLogger("mcp_once.proxy")

#: `scheme://path`, as FastMCP's namespacing reads a resource URI.
_URI = re.compile(r"^([^:]+://)(.*?)$")


@dataclass(frozen=True, slots=True)
class _Mount:
    """One upstream's proxy on the front, and the names it has there."""

    proxy: OnceProxy
    #: The upstream's name as the prefix of its tools and prompts (None: nothing prefixed).
    prefix: str | None

    def name_in(self, name: str) -> str | None:
        """The upstream's own name of the front's tool or prompt `name` (None: not its)."""
        if self.prefix is None:
            return name
        head = f"{self.prefix}_"
        return name[len(head) :] if name.startswith(head) else None

    def uri_in(self, uri: str) -> str | None:
        """The upstream's own URI (template) of the front's `uri` (None: not its)."""
        if self.prefix is None:
            return uri
        match = _URI.match(uri)
        if match is None:
            return uri
        scheme, path = match.groups()
        head = f"{self.prefix}/"
        return f"{scheme}{path[len(head) :]}" if path.startswith(head) else None


class _UpstreamMount(FastMCPProvider):
    """FastMCP's provider of a mounted server, listing an upstream that cannot be reached (or
    answers a listing with an error) as it was last listed, instead of failing the front's
    listing; a call of its tools still reaches it, and answers -32013 while it is down."""

    def __init__(self, proxy: OnceProxy) -> None:
        super().__init__(proxy)
        self.proxy = proxy
        self._last: dict[str, Sequence[Any]] = {}
        self._failing: set[str] = set()

    async def _kept(self, what: str, listing: Callable[[], Awaitable[Sequence[Any]]]) -> Any:
        try:
            found = await listing()
        except MCPError as exc:
            if what not in self._failing:  # once per outage, not at every listing
                self._failing.add(what)
                logger.warning(
                    "the upstream %r cannot list its %s now (%s): listing them as last listed"
                    " (%d); its calls answer -32013 (not run, retry later) until it is back",
                    self.proxy.link.upstream.name,
                    what,
                    exc.error.message,
                    len(self._last.get(what, ())),
                )
            return self._last.get(what, ())
        self._failing.discard(what)
        self._last[what] = found
        return found

    async def _list_tools(self) -> Any:
        return await self._kept("tools", super()._list_tools)

    async def _list_resources(self) -> Any:
        return await self._kept("resources", super()._list_resources)

    async def _list_resource_templates(self) -> Any:
        return await self._kept("resource templates", super()._list_resource_templates)

    async def _list_prompts(self) -> Any:
        return await self._kept("prompts", super()._list_prompts)


class _Dispatch(Middleware):
    """Sends each `tools/call` of an upstream's tool to that upstream's proxy (see the module
    doc: above FastMCP's mounted-tool path, so that the guard's errors keep their codes)."""

    def __init__(self, gateway: OnceGateway) -> None:
        self.gateway = gateway

    async def on_call_tool(
        self,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        message = context.message
        found = self.gateway.route(message.name)
        # A call asking for a tool version (FastMCP's `_meta.fastmcp.version`) takes FastMCP's
        # own mounted path, which carries the version down; proxied tools have none.
        if found is None or "fastmcp" in (message.meta or {}):
            return await call_next(context)
        mount, name = found
        try:
            result = await mount.proxy.call_tool(name, message.arguments)
        except MCPError as exc:
            raise refusal_on_front(exc, mount.prefix) from exc
        # A task's id as the front hands it out, first answer and replay alike (`task_routes`).
        return created_on_front(result, mount.prefix)  # type: ignore[return-value]


class OnceGateway(LinkedServer):
    """The front of several upstreams, each its own `OnceProxy` (`proxies`, by upstream name),
    whose links it keeps open while it serves (`LinkedServer`). Opening starts (lists) every
    upstream at once; one that cannot be started is logged and served as unreachable."""

    def __init__(self, proxies: Sequence[OnceProxy], *, prefixed: bool, **settings: Any) -> None:
        super().__init__(**settings)
        self.proxies: dict[str, OnceProxy] = {p.link.upstream.name: p for p in proxies}
        self._mounts = [_Mount(p, name if prefixed else None) for name, p in self.proxies.items()]
        # Whatever an upstream's provider raises for a lookup reaches the caller (an upstream
        # that cannot be reached: -32013); its listings never raise (`_UpstreamMount`).
        self.provider_error_strategy = "raise"

    def route(self, name: str) -> tuple[_Mount, str] | None:
        """The mount of the front's tool or prompt `name`, and the upstream's own name of it."""
        for mount in self._mounts:
            own = mount.name_in(name)
            if own is not None:
                return mount, own
        return None

    def route_task(self, task_id: str) -> tuple[OnceProxy, str | None, str] | None:
        """The proxy of the upstream whose task the front's `task_id` is, its prefix, and the
        upstream's own id of it: routed as a tool name is (`task_routes`)."""
        found = self.route(task_id)
        if found is None:
            return None
        mount, own = found
        return mount.proxy, mount.prefix, own

    def _route_reference(
        self, ref: CompletionReference
    ) -> tuple[_Mount, CompletionReference] | None:
        for mount in self._mounts:
            if isinstance(ref, PromptReference):
                own = mount.name_in(ref.name)
                if own is not None:
                    return mount, ref.model_copy(update={"name": own})
            elif isinstance(ref, ResourceTemplateReference):
                own = mount.uri_in(ref.uri)
                if own is not None:
                    return mount, ref.model_copy(update={"uri": own})
        return None

    async def _complete(
        self,
        ref: CompletionReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion:
        found = self._route_reference(ref)
        if found is None:  # no upstream's: nothing to offer, as FastMCP answers an unknown ref
            return Completion(values=[])
        mount, own = found
        return await complete_upstream(mount.proxy.link, own, argument, context)

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[OnceGateway]:
        """The gateway with every upstream's link open, for the block."""
        async with AsyncExitStack() as links:
            for proxy in self.proxies.values():
                await links.enter_async_context(proxy.linked())
            # Every upstream started at once: starting one (an `npx`, a `uvx`) takes seconds.
            async with anyio.create_task_group() as starting:
                for proxy in self.proxies.values():
                    starting.start_soon(functools.partial(proxy.start, required=False))
            self._check_started()
            await self._offer_tasks()
            self._open = True
            try:
                yield self
            finally:
                self._open = False

    async def _offer_tasks(self) -> None:
        """Serve the tasks extension (`task_routes`) if an upstream may task a call: one that
        advertised it as it started, or an HTTP one not reached yet (it may, once it is back;
        the front's capabilities are fixed once it serves). A stdio upstream never does (its
        calls are plain calls, `tasks.py`), nor one that did not advertise it."""
        if TASKS_EXTENSION in self._extensions:
            return  # opened before
        for proxy in self.proxies.values():
            if await _may_task(proxy):
                forwarding = proxy._extensions[TASKS_EXTENSION]
                params = {b.method: b.params_type for b in forwarding.methods()}
                self.add_extension(TaskRoutes(self.route_task, params))
                return

    def _check_started(self) -> None:
        failed = [p for p in self.proxies.values() if p.start_failed is not None]
        if failed and len(failed) == len(self.proxies):
            raise UpstreamStartFailed("; ".join(str(p.start_failed) for p in failed))
        for proxy in failed:
            name = proxy.link.upstream.name
            logger.warning(
                "%s: serving the other upstreams; %r has no tools listed until it starts, and a"
                " call of one (%s_...) answers -32013 (not run, retry later) and starts it again",
                proxy.start_failed,
                name,
                name,
            )


async def _may_task(proxy: OnceProxy) -> bool:
    """Whether `proxy`'s upstream may create a task (`OnceGateway._offer_tasks`)."""
    if proxy.link.upstream.url is None:
        return False
    try:
        client = await proxy.link.client()
    except UpstreamUnreachable:
        return True  # not reached: it may, once it is back
    capabilities = client.server_capabilities
    return capabilities is not None and TASKS_EXTENSION in (capabilities.extensions or {})


def build_gateway(
    upstreams: Sequence[Upstream],
    store: KeyStore | Mapping[str, KeyStore],
    *,
    policy: ProxyPolicy | None = None,
    retry: RetryPolicy | None = None,
    auth: AuthProvider | None = None,
    max_in_flight: int | None = DEFAULT_MAX_IN_FLIGHT,
    max_body: int | None = DEFAULT_MAX_BODY,
    on_listing: Mapping[str, Callable[[dict[str, dict[str, Any]]], None]] | None = None,
    **options: Any,
) -> OnceGateway:
    """A FastMCP server in front of every upstream of `upstreams`, each through a proxy of its
    own (`build_proxy`), its tools named `<name>_<tool>` (with a single upstream, as it names
    them). `store`: one store for all (records are scoped by each upstream's identity), or one
    per upstream name. `policy`: the plain tables apply to every upstream, a
    `[servers."<name>"]` section to that upstream only; `options` and `retry` as for
    `build_proxy`. `auth` and `max_body` guard the front as `build_proxy`'s do; `max_in_flight`
    bounds each principal's calls in flight to each upstream (its proxy's own bound).
    `on_listing`: by upstream name, that upstream's proxy's `on_listing` (`build_proxy`).

    `UpstreamConfigError` when no upstream is given or two would share a name on the front. A
    policy section naming no upstream is logged as a warning, and so is a plain table that
    matches no tool of any upstream (once every upstream has listed its tools)."""
    if not upstreams:
        raise UpstreamConfigError("a proxy in front of several upstreams needs at least one")
    check_names(upstreams)
    policy = policy or ProxyPolicy()
    names = [u.name for u in upstreams]
    for section in policy.servers:
        if section not in names:
            logger.warning(
                "policy section [servers.%r] names no upstream of this proxy (upstreams: %s)",
                section,
                ", ".join(names),
            )
    plain = {r.label for r in policy.rules if r.server is None}
    unmatched_by: dict[str, list[str]] = {}
    listed: list[str] = []  # every upstream's tool names, for the nearest to a plain table

    def reporter(name: str) -> Callable[[list[str], list[str]], None]:
        def report(patterns: list[str], tools: list[str]) -> None:
            for pattern in patterns:
                if pattern not in plain:
                    logger.warning("%s", policy.said_unmatched(pattern, tools, of=repr(name)))
            unmatched_by[name] = [p for p in patterns if p in plain]
            listed.extend(tools)
            if len(unmatched_by) == len(names):  # every upstream has listed: report once
                common = set.intersection(*(set(found) for found in unmatched_by.values()))
                for pattern in sorted(common):
                    said = policy.said_unmatched(pattern, listed, of="any upstream")
                    logger.warning("%s", said)

        return report

    proxies = [
        build_proxy(
            upstream,
            store if isinstance(store, KeyStore) else store[upstream.name],
            policy=policy,
            retry=retry,
            unmatched=reporter(upstream.name),
            on_listing=(on_listing or {}).get(upstream.name),
            max_in_flight=max_in_flight,
            **options,
        )
        for upstream in upstreams
    ]
    prefixed = len(proxies) > 1
    gateway = OnceGateway(
        proxies,
        prefixed=prefixed,
        name=f"mcp-once proxy: {', '.join(names)}" if prefixed else proxies[0].name,
        version=_VERSION,
        dereference_schemas=False,
        auth=auth,
        max_body=max_body,
    )
    for mount in gateway._mounts:
        gateway.add_provider(_UpstreamMount(mount.proxy), namespace=mount.prefix or "")
    gateway.add_completion_handler(gateway._complete)
    gateway.add_middleware(_Dispatch(gateway))
    if not prefixed:
        # One upstream: the front is that upstream's, as a single proxy's (its serverInfo and
        # instructions), unprefixed as FastMCP's proxy of a one-server config.
        only = proxies[0]
        gateway.add_middleware(UpstreamMetadata(only.provider, only.name))
    seam.install(gateway)
    return gateway
