"""`IdempotencyMiddleware(store, **options)`: mcp-once for FastMCP 4.x servers.

```python
from fastmcp import FastMCP
from idempotency import open_store
from idempotency.fastmcp import IdempotencyMiddleware

mcp = FastMCP("shop")
mcp.add_middleware(IdempotencyMiddleware(open_store("redis://localhost:6379/0")))
```

FastMCP runs tools through its own registration and hands them only its own `Context`, so
`@idempotent` cannot work there (it refuses, loudly). This middleware is the same `Guard` behind
the same options as `idempotent` / `install`, at FastMCP's two seams: `on_call_tool` runs a call
under the guard, `on_list_tools` tells each caller what holds for it. Its choices, each tested:

- Which tools: all (default), those named in `tools`, those carrying one of `tags` — never a
  task-capable tool (`task=`): its body runs later in a worker, outside every middleware, so the
  guard would cover only the enqueueing. Such tools are listed exactly as registered (no
  `idempotentHint`, no `_meta` entry): nothing is promised that is not kept, and the log says
  so once per tool.
- The key, the caller and the principal come from the wire request behind FastMCP's context
  (the middleware message's own `_meta` is rebuilt by FastMCP and lacks them): derived keys are
  bound to the caller, and FastMCP's access token (the SDK's, on the HTTP request) scopes keys
  per principal, exactly as on `MCPServer`.
- What FastMCP reports below the guard is judged by `_fastmcp_results`: refusals before the body
  release the claim; a tool's `timeout=` expiring is OUTCOME_UNKNOWN (-32012), as for the guard's
  own `max_run_time`, never a stored "timed out"; body errors are stored as FastMCP renders them.
- The guarded tool is the one FastMCP will run, found as `FastMCP.call_tool` finds it: by name
  under the version it was asked for (an exact version or a `gte`/`lt` range), else by an
  app-callable tool's hashed name (`<hash>_<local_name>`); see `_tool`. A name neither finds is
  refused with FastMCP's own not-found error before anything runs, never passed on unguarded.
- One guard per tools/call in a process: a call already running under a guard (a tool calling
  another, a mounted server's own middleware) passes through, so a parent and a mounted child that
  both add the middleware keep one record, under the outermost.
- Place it outside (add it before) FastMCP's `ResponseCachingMiddleware`: a cache in front of the
  guard would hand one caller's listing and one key's marker to others. That order is refused
  (-32603 naming the fix) rather than served. Rate limiting may sit on either side: a request it
  rejects never ran, and a rejection inside the guard releases the claim.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from fastmcp.exceptions import NotFoundError
from fastmcp.server.context import Context
from fastmcp.server.dependencies import extract_version_spec
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.server.middleware.caching import ResponseCachingMiddleware
from fastmcp.server.providers.addressing import parse_hashed_backend_name, tool_identity
from fastmcp.tools.base import Tool, ToolResult
from fastmcp.utilities.versions import VersionSpec
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp_types import INTERNAL_ERROR, CallToolRequestParams, ListToolsRequest
from typing_extensions import Unpack

from ._advertise import advertise_tool, declares_idempotent
from ._caller import caller_of
from ._fastmcp_results import error_result, judged, to_fastmcp, to_guard
from ._guard import Guard, ToolCall
from ._guard import ToolResult as GuardResult
from ._policy import PolicyOptions, make_policy
from ._store import KeyStore
from ._telemetry import logger

__all__ = ["IdempotencyMiddleware"]

#: True while a tools/call runs under a guard in this task: inner dispatches pass through.
_guarding: ContextVar[bool] = ContextVar("mcp_once_fastmcp_guarding", default=False)


def _names(value: Collection[str] | None, what: str) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        raise TypeError(f"{what} must be a collection of strings, not one string: [{value!r}]")
    return frozenset(value)


def _request(ctx: Context) -> ServerRequestContext[Any, Any] | None:
    """The SDK's request context behind FastMCP's (None outside a wire request)."""
    wrapped = ctx.request_context
    # FastMCP's documented escape hatch to the SDK context: the raw `_meta`, the HTTP request
    # (its authenticated user) and the connection all live there.
    return None if wrapped is None else wrapped._srctx


def _requested_version(meta: Mapping[str, Any] | None) -> VersionSpec | None:
    """The version FastMCP's `call_tool` was asked for, from the middleware message's `_meta`.

    FastMCP runs the version it was given, not what the message says; the message carries it
    as `_version_request_meta` wrote it: `{"fastmcp": {"version": "1.0"}}` for an exact version,
    `{"fastmcp": {"version": {"gte": .., "lt": .., "eq": ..}}}` (the set ones) for a range.
    Anything else there (a middleware outside this one rewrote it) cannot be read back into the
    version FastMCP will run, so the call is refused rather than guarded as another version.
    `VersionSpec()` with nothing set leaves no `_meta` and reads as no version: the same tool,
    or (its highest version disabled) a lower one FastMCP then refuses as not found, which
    releases the claim with nothing run.
    """
    exact = extract_version_spec(dict(meta) if meta else None)
    if exact is not None:
        return VersionSpec(eq=exact)
    fastmcp_meta = (meta or {}).get("fastmcp")
    wanted = fastmcp_meta.get("version") if isinstance(fastmcp_meta, Mapping) else None
    if wanted is None:
        return None
    if (
        isinstance(wanted, Mapping)
        and set(wanted) <= {"gte", "lt", "eq"}
        and all(isinstance(v, str) for v in wanted.values())
    ):
        return VersionSpec(gte=wanted.get("gte"), lt=wanted.get("lt"), eq=wanted.get("eq"))
    raise MCPError(
        INTERNAL_ERROR,
        f"The idempotency guard cannot tell which version of the tool FastMCP will run from"
        f" _meta.fastmcp.version = {wanted!r}; nothing was run.",
    )


class IdempotencyMiddleware(Middleware):
    """Guards FastMCP tool calls: at most one execution per (scope, tool, key), replays after.

    `tools` (names) and `tags` choose the guarded tools; with neither, every tool is guarded.
    Options and defaults: see `Policy` (as for `idempotent` and `install`).
    """

    def __init__(
        self,
        store: KeyStore,
        *,
        tools: Collection[str] | None = None,
        tags: Collection[str] | None = None,
        **options: Unpack[PolicyOptions],
    ) -> None:
        self.guard = Guard(store, make_policy(options))
        self._tools = _names(tools, "tools")
        self._tags = _names(tags, "tags")
        self._told: set[str] = set()

    def guards(self, tool: Tool) -> bool:
        """Whether calls of `tool` run under the guard (and its listing says so)."""
        chosen = (self._tools is None and self._tags is None) or (
            (self._tools is not None and tool.name in self._tools)
            or (self._tags is not None and not self._tags.isdisjoint(tool.tags))
        )
        if chosen and tool.task_config.supports_tasks():
            if tool.name not in self._told:
                self._told.add(tool.name)
                logger.warning(
                    "tool %r can run as a background task, outside every middleware: it is not"
                    " guarded, and not listed as guarded",
                    tool.name,
                )
            return False
        return chosen

    async def on_list_tools(
        self,
        context: MiddlewareContext[ListToolsRequest],
        call_next: CallNext[ListToolsRequest, Sequence[Tool]],
    ) -> Sequence[Tool]:
        tools = await call_next(context)
        ctx = context.fastmcp_context
        if ctx is not None:
            self._check_order(ctx)
        request = None if ctx is None else _request(ctx)
        known = caller_of(request) is not None
        policy = self.guard.policy
        return [advertise_tool(t, policy, known) if self.guards(t) else t for t in tools]

    async def on_call_tool(
        self,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        ctx = context.fastmcp_context
        if _guarding.get() or ctx is None:
            return await call_next(context)
        message = context.message
        tool, guarded_as = await self._tool(ctx, message)
        if not self.guards(tool):
            return await call_next(context)
        self._check_order(ctx)
        request = _request(ctx)
        call = ToolCall(
            server=ctx.fastmcp.name,
            tool=guarded_as,
            arguments=message.arguments,
            meta=None if request is None else request.meta,
            request=request,
        )
        effect_free = self.guard.policy.effect_free

        async def execute() -> GuardResult:
            try:
                result = await call_next(context)
            except Exception as exc:
                verdict = judged(exc, effect_free)
                if verdict is exc:
                    raise  # as FastMCP raised it: the guard stores it as FastMCP renders it
                raise verdict from exc
            return to_guard(result)

        token = _guarding.set(True)
        try:
            answer = await self.guard.call(
                call,
                execute,
                error_result=functools.partial(error_result, message.name),
                takeover=self.guard.policy.takeover_for(declares_idempotent(tool.annotations)),
            )
        finally:
            _guarding.reset(token)
        return to_fastmcp(answer)

    @staticmethod
    async def _tool(ctx: Context, message: CallToolRequestParams) -> tuple[Tool, str]:
        """The tool FastMCP will run for this call, and the name the guard keeps its records under.

        Found exactly as `FastMCP.call_tool` finds it, with FastMCP's own functions on the same
        server: `get_tool(name, version)`, then for a `<hash>_<local_name>` name
        `get_tool_by_hash` (FastMCP's hashed path ignores the version, so this does too). The
        version is the one `call_tool` was given, read back from the `_meta` it puts on this
        message (`_version_request_meta`): an exact version as a string, a range as a dict.

        Nothing found: FastMCP would raise `NotFoundError` from those same lookups and run
        nothing, but only if nothing changes in between. A middleware inside this one may rename
        the call or answer it itself, and a tool may be registered or enabled concurrently, so
        "not found here" does not prove "nothing will run". The call is therefore refused here
        with FastMCP's own `NotFoundError` (on the wire: FastMCP's "Unknown tool" result,
        byte-identical), never passed on unguarded, whatever `tools` and `tags` choose (a tool
        not found has no name or tags to judge).

        The records' name: a call by name keeps its records under that name, as always. The
        hashed name is a second address of the same tool, so it shares the display name's records
        (one key, one execution, whichever address a retry uses) when that display name
        addresses the same tool here, i.e. resolves to a tool with the same identity hash.
        Otherwise (another tool listed under that name shadows it, or none) the hashed name is
        kept: two different tools never share a record.
        """
        server = ctx.fastmcp
        name = message.name
        tool = await server.get_tool(name, _requested_version(message.meta))
        if tool is not None:
            return tool, name
        hashed = parse_hashed_backend_name(name)
        if hashed is not None:
            tool = await server.get_tool_by_hash(*hashed)
        if tool is None:
            raise NotFoundError(
                f"Unknown tool: {name!r} (the idempotency guard found no tool FastMCP would run"
                " under this name; nothing was run)"
            )
        listed = await server.get_tool(tool.name)
        same = listed is not None and tool_identity(listed) == tool_identity(tool)
        return tool, tool.name if same else name

    def _check_order(self, ctx: Context) -> None:
        chain = ctx.fastmcp.middleware
        outer = chain[: chain.index(self)] if self in chain else []
        if any(isinstance(m, ResponseCachingMiddleware) for m in outer):
            raise MCPError(
                INTERNAL_ERROR,
                "Server misconfiguration: ResponseCachingMiddleware runs before"
                " IdempotencyMiddleware, so cached tool lists and results would bypass the"
                " idempotency guard. Add IdempotencyMiddleware first; nothing was run.",
            )
