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

- Which tools: all (default), those named in `tools`, those carrying one of `tags`.
- A task-augmented call of a task-capable tool (`task=`, the `io.modelcontextprotocol/tasks`
  extension) is a call (rule 23): FastMCP's task extension answers it below the middleware with
  a `CreateTaskResult`, which the record keeps as the key's answer, so a re-send of the key gets
  the same task (its `taskId`), marked replayed, and no second task is created. The task's body
  runs later, outside every middleware: a task backend fences it with `run_task_body`
  (`_guard/task_body.py`), keyed by the task id, so a redelivery never runs it twice;
  `fastmcp-tasks`' Docket worker does so by itself (`_integrations/fastmcp/docket.py`).
- The key, the caller and the principal come from the wire request behind FastMCP's context
  (the middleware message's own `_meta` is rebuilt by FastMCP and lacks them): derived keys are
  bound to the caller, and FastMCP's access token (the SDK's, on the HTTP request) scopes keys
  per principal, exactly as on `MCPServer`.
- Where the guard protects nothing — a keyless call with no caller to bind a derived key to,
  `keys="optional"`, a tool not chosen, task-capable or unknown, a read-only or `underived`
  tool called without a key, `fail_open` with the store down — the call is `call_next` itself:
  FastMCP's answer, errors, exception types, spans and logs are exactly what they are without
  the middleware. Only a protected call gets the guard's span, a child of FastMCP's request
  span (`tools/call <name>`), never a second SERVER span.
- Only the tool's own outcome is stored: what FastMCP reports below the guard is judged by
  `_integrations/fastmcp/results.py`. A failure before FastMCP entered the tool (another
  middleware, auth, lookup, argument validation: `_integrations/fastmcp/body.py`) releases the
  claim and propagates as FastMCP raised it; a tool's `timeout=` expiring is OUTCOME_UNKNOWN
  (-32012), as for the guard's own `max_run_time`, never a stored "timed out"; body errors are
  stored as FastMCP renders them.
- The guarded tool is the one FastMCP will run, found as `FastMCP.call_tool` finds it: by name
  under the version it was asked for (an exact version or a `gte`/`lt` range), else by an
  app-callable tool's hashed name (`<hash>_<local_name>`); see `_tool`. Its version is part of
  its identity: two versions never share a record.
- Authorization is FastMCP's, in any order: each `AuthMiddleware` inside the guard is asked
  before anything is claimed, so an unauthorized caller gets exactly its answer, and a hidden
  tool is FastMCP's to report ("not found or not authorized"), never the guard's.
- Derived keys merge blind re-sends, not decisions: read-only tools, tools named in
  `underived` and FastMCP's own tools (`create_session`, `search_tools`, …) are never merged
  without a client key.
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
import sys
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.context import Context
from fastmcp.server.dependencies import extract_version_spec
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.server.providers.addressing import parse_hashed_backend_name, tool_identity
from fastmcp.server.telemetry import server_span
from fastmcp.tools.base import Tool, ToolResult
from fastmcp.utilities.versions import VersionSpec
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp_types import INTERNAL_ERROR, CallToolRequestParams, CallToolResult, ListToolsRequest
from pydantic import BaseModel
from typing_extensions import Unpack

from ._guard import answers, tasks
from ._guard.advertise import advertise_schema, advertise_tool, declares_idempotent, derivable
from ._guard.caller import caller_of
from ._guard.guard import Guard, ToolCall
from ._guard.guard import ToolResult as GuardResult
from ._guard.keyplaces import declares_argument, without_key
from ._guard.policy import PolicyOptions, make_policy
from ._guard.task_body import body_result
from ._guard.task_body import run_task_body as _run_task_body
from ._integrations.fastmcp.body import install_body_watch, watching_body
from ._integrations.fastmcp.docket import install as fence_docket_bodies
from ._integrations.fastmcp.results import (
    as_call_tool_result,
    as_tool_result,
    error_result,
    judged,
    to_guard,
)
from ._integrations.reconcile_records import GuardedServer, GuardedTool, add_finder
from ._stores.store import KeyStore

__all__ = [
    "IdempotencyMiddleware",
    "as_call_tool_result",
    "as_tool_result",
    "run_task_body",
    "stored_task_result",
]

_AUTHORIZATION = "fastmcp.server.middleware.authorization"
_CACHING = "fastmcp.server.middleware.caching"

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


def _instance_of(middleware: Middleware, module: str, name: str) -> bool:
    """Whether `middleware` is an instance of FastMCP's `module.name`, without importing it.

    The caching and authorization middleware modules load optional dependencies (the caching
    one, `py-key-value`) that a server not using them never loads; importing them here would
    make every guarded server load them. A class whose module was never imported has no
    instances, so the check needs only what is already in `sys.modules`.
    """
    loaded = sys.modules.get(module)
    cls = getattr(loaded, name, None) if loaded is not None else None
    return isinstance(cls, type) and isinstance(middleware, cls)


def _identity(name: str, tool: Tool) -> str:
    """The tool as records know it: its name, and its version where it has one."""
    return name if tool.version is None else f"{name}@{tool.version}"


async def _authorized(context: MiddlewareContext[CallToolRequestParams]) -> ToolResult:
    """The `call_next` an authorization check is asked with: it lets the caller through and
    runs nothing."""
    return ToolResult(content=[])


def _rendered(classes: Mapping[str, type[BaseModel]], tool: str, answer: GuardResult) -> ToolResult:
    """The guard's answer as FastMCP's chain carries it: a record's task as the task itself (a
    model FastMCP's runner puts on the wire as is), of the task extension's own class where this
    middleware has seen it for `tool` (`tasks.typed`); a tool result as a `ToolResult`."""
    task = tasks.rendered(answer)
    if isinstance(task, tasks.TaskCreated):
        # FastMCP's chain carries any model onward (`ToolCallOutcome`).
        return tasks.typed(task, classes.get(tool))  # type: ignore[return-value]
    return as_tool_result(answer)


def _label_request_span(ctx: Context, tool: Tool, name: str) -> None:
    """Label FastMCP's request span as FastMCP's tool path labels it, for a call the guard
    answered itself (a replay, or one of its own errors): FastMCP's tool path never ran, so
    without this its SERVER span would stay a bare `tools/call`. `server_span` enriches the
    request's span where it is current and opens nothing; nothing is raised inside it."""
    with server_span(
        f"tools/call {name}", "tools/call", ctx.fastmcp.name, "tool", name, tool_name=name
    ) as span:
        span.set_attributes(tool.get_span_attributes())


class IdempotencyMiddleware(Middleware):
    """Guards FastMCP tool calls: at most one execution per (scope, tool, key), replays after.

    `tools` (names) and `tags` choose the guarded tools; with neither, every tool is guarded.
    `underived` names tools whose keyless calls are never merged under a derived key (every
    call meant to be new, as `create_session`); a client key still replays. Options and
    defaults: see `Policy` (as for `idempotent` and `install`).
    """

    def __init__(
        self,
        store: KeyStore,
        *,
        tools: Collection[str] | None = None,
        tags: Collection[str] | None = None,
        underived: Collection[str] = (),
        **options: Unpack[PolicyOptions],
    ) -> None:
        self.guard = Guard(store, make_policy(options))
        self._tools = _names(tools, "tools")
        self._tags = _names(tags, "tags")
        self._underived = _names(underived, "underived") or frozenset()
        #: The class of the task extension's `CreateTaskResult`, per tool, once seen (`_rendered`).
        self._task_classes: dict[str, type[BaseModel]] = {}
        install_body_watch()
        fence_docket_bodies(run_task_body, _has_guard)

    def guards(self, tool: Tool) -> bool:
        """Whether calls of `tool` run under the guard (and its listing says so)."""
        chosen = (self._tools is None and self._tags is None) or (
            (self._tools is not None and tool.name in self._tools)
            or (self._tags is not None and not self._tags.isdisjoint(tool.tags))
        )
        return chosen

    def derivable(self, tool: Tool) -> bool:
        """Whether a keyless call of `tool` may be merged under a derived key.

        Not for a read-only tool (a merged read is only a stale read), nor for one named in
        `underived`, nor for FastMCP's own tools (session lifecycle, search and
        resources/prompts-as-tools transforms: functions of the `fastmcp` package), whose every
        call is meant to be new or is a read; and not when the policy turns derivation off.
        """
        # A function tool's `fn` is a field; read where pydantic keeps it, because a missing
        # attribute of a model (every other tool) costs a raised `AttributeError` (~3 µs).
        fn = vars(tool).get("fn")
        builtin = str(getattr(fn, "__module__", "")).startswith("fastmcp.")
        opted_out = builtin or tool.name in self._underived
        return derivable(self.guard.policy, tool.annotations, opted_out)

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
        return [self._advertised(t, known) if self.guards(t) else t for t in tools]

    def _advertised(self, tool: Tool, caller_known: bool) -> Tool:
        policy = self.guard.policy
        listed = advertise_tool(tool, policy, caller_known and self.derivable(tool))
        schema = advertise_schema(listed.parameters, policy)
        if schema is listed.parameters:
            return listed
        return listed.model_copy(update={"parameters": schema})

    def _for_body(
        self, tool: Tool, context: MiddlewareContext[CallToolRequestParams]
    ) -> MiddlewareContext[CallToolRequestParams]:
        """The call as the tool's body gets it: without the key argument unless the tool's own
        signature declares it (FastMCP refuses arguments a function does not take)."""
        path = self.guard.policy.key_argument
        arguments = context.message.arguments
        if path is None or not arguments or declares_argument(tool.parameters, path):
            return context
        stripped = without_key(arguments, path)
        if stripped == arguments:
            return context
        return context.copy(message=context.message.model_copy(update={"arguments": stripped}))

    async def on_notification(
        self,
        context: MiddlewareContext[Any],
        call_next: CallNext[Any, Any],
    ) -> Any:
        """A `notifications/cancelled` for an answer already handed out marks it undelivered
        (rule 15, `_guard/answers.py`); every notification then goes on untouched."""
        ctx = context.fastmcp_context
        if context.method == "notifications/cancelled" and ctx is not None:
            message = context.message
            await answers.cancelled(_request(ctx), message if isinstance(message, dict) else None)
        return await call_next(context)

    async def on_call_tool(
        self,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        ctx = context.fastmcp_context
        if _guarding.get() or ctx is None:
            return await call_next(context)
        message = context.message
        found = await self._tool(ctx, message)
        if found is None:
            # Unknown, or hidden from this caller: FastMCP answers, untouched; should a tool be
            # entered after all, the watch refuses it (`_integrations/fastmcp/body.py`).
            with watching_body(unknown=message.name):
                return await call_next(context)
        if not self.guards(found[0]):
            return await call_next(context)
        tool, guarded_as = found
        self._check_order(ctx)
        sent = context  # the guard reads the key from the call as sent
        context = self._for_body(tool, context)
        request = _request(ctx)
        call = ToolCall(
            server=ctx.fastmcp.name,
            tool=guarded_as,
            arguments=sent.message.arguments,
            meta=None if request is None else request.meta,
            request=request,
            derivable=self.derivable(tool),
        )
        effect_free = self.guard.policy.effect_free
        admitted: list[bool] = []  # set once FastMCP's authorization let the call through
        handed_on: list[bool] = []  # set once the call goes below the guard

        async def admit() -> None:
            await self._authorize(context)
            admitted.append(True)

        async def execute() -> GuardResult:
            handed_on.append(True)
            with watching_body() as body:
                try:
                    result = await call_next(context)
                except Exception as exc:
                    verdict = judged(exc, effect_free, body_started=body.started)
                    if verdict is exc:
                        raise  # as FastMCP raised it: the guard stores it as FastMCP renders it
                    raise verdict from exc
            task = tasks.recorded(result)  # the task extension created a task: it is the answer
            if task is None:
                return to_guard(result)
            if isinstance(result, BaseModel):
                self._task_classes[guarded_as] = type(result)
            return task

        async def passthrough() -> ToolResult:
            handed_on.append(True)
            return await call_next(context)

        token = _guarding.set(True)
        try:
            return await self.guard.call(
                call,
                execute,
                error_result=functools.partial(error_result, message.name),
                takeover=self.guard.policy.takeover_for(declares_idempotent(tool.annotations)),
                passthrough=passthrough,
                render=functools.partial(_rendered, self._task_classes, guarded_as),
                admit=admit,
                convert=lambda value: to_guard(tool.convert_result(value)),
            )
        finally:
            _guarding.reset(token)
            if admitted and not handed_on:  # the guard answered: a replay, or its own error
                _label_request_span(ctx, tool, message.name)

    async def _authorize(self, context: MiddlewareContext[CallToolRequestParams]) -> None:
        """FastMCP's authorization answer before anything is claimed, wherever it sits.

        Each `AuthMiddleware` that runs inside this one is asked first, with a `call_next` that
        runs nothing: a caller it refuses gets exactly its error (same type, same message, its
        scope shortfall over the rest of the chain), and the guard neither claims, replays nor
        tells whether a record exists. The chain then runs as usual, so the check repeats there.
        """
        ctx = context.fastmcp_context
        assert ctx is not None
        chain = ctx.fastmcp.middleware
        inner = chain[chain.index(self) + 1 :] if self in chain else []
        for middleware in inner:
            if _instance_of(middleware, _AUTHORIZATION, "AuthMiddleware"):
                await middleware.on_call_tool(context, _authorized)

    @staticmethod
    async def _tool(ctx: Context, message: CallToolRequestParams) -> tuple[Tool, str] | None:
        """The tool FastMCP will run for this call and the identity the guard keeps its records
        under; None when FastMCP finds no tool for this caller.

        Found exactly as `FastMCP.call_tool` finds it, with FastMCP's own functions on the same
        server: `get_tool(name, version)`, then for a `<hash>_<local_name>` name
        `get_tool_by_hash` (FastMCP's hashed path ignores the version, so this does too). The
        version is the one `call_tool` was given, read back from the `_meta` it puts on this
        message (`_version_request_meta`): an exact version as a string, a range as a dict.

        Nothing found (no such tool, disabled, or hidden from this caller by component auth):
        the call is FastMCP's to answer, with its own error and span, exactly as without the
        guard; nothing is claimed, so the guard tells no one whether a hidden tool exists. Not
        found here does not prove nothing will run (a middleware inside this one may rename the
        call, a tool may be registered in between): should FastMCP enter a tool for this call
        after all, it is refused with FastMCP's not-found text, never run unguarded.

        The records' identity: a call by name keeps its records under that name, as always, with
        the version FastMCP will run appended (`name@version`) for a versioned tool: two
        versions are two tools and never share a record, whichever key is sent. The
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
            return tool, _identity(name, tool)
        hashed = parse_hashed_backend_name(name)
        if hashed is not None:
            tool = await server.get_tool_by_hash(*hashed)
        if tool is None:
            return None
        listed = await server.get_tool(tool.name)
        same = listed is not None and tool_identity(listed) == tool_identity(tool)
        return tool, _identity(tool.name if same else name, tool)

    def _check_order(self, ctx: Context) -> None:
        chain = ctx.fastmcp.middleware
        outer = chain[: chain.index(self)] if self in chain else []
        if any(_instance_of(m, _CACHING, "ResponseCachingMiddleware") for m in outer):
            raise MCPError(
                INTERNAL_ERROR,
                "Server misconfiguration: ResponseCachingMiddleware runs before"
                " IdempotencyMiddleware, so cached tool lists and results would bypass the"
                " idempotency guard. Add IdempotencyMiddleware first; nothing was run.",
            )


def _guarding_middleware(server: FastMCP, tool: Tool) -> IdempotencyMiddleware | None:
    """The outermost `IdempotencyMiddleware` of `server` that guards `tool`, if any."""
    for middleware in server.middleware:
        if isinstance(middleware, IdempotencyMiddleware) and middleware.guards(tool):
            return middleware
    return None


def _has_guard(server: FastMCP) -> bool:
    return any(isinstance(middleware, IdempotencyMiddleware) for middleware in server.middleware)


async def run_task_body(
    server: FastMCP,
    tool: Tool,
    task_id: str,
    arguments: Mapping[str, Any] | None,
    body: Callable[[], Awaitable[ToolResult]],
) -> ToolResult:
    """Run the body of task `task_id` (a task-augmented call of `tool` on `server`) at most once
    (rule 23), for a task backend to call where it runs a task: `body` runs the tool and returns
    its `ToolResult`. Under the outermost `IdempotencyMiddleware` of `server` that guards `tool`,
    keyed by the task id: a redelivery of a finished body gets its stored result (replayed, the
    body not run), one of a body that died mid-run OUTCOME_UNKNOWN (-32012) unless the tool may
    run twice. Without such a middleware, `body()` as it is."""
    middleware = _guarding_middleware(server, tool)
    if middleware is None:
        return await body()
    guard = middleware.guard
    effect_free = guard.policy.effect_free

    async def execute() -> GuardResult:
        try:
            result = await body()
        except Exception as exc:
            verdict = judged(exc, effect_free, body_started=True)
            if verdict is exc:
                raise
            raise verdict from exc
        return to_guard(result)

    answer = await _run_task_body(
        guard,
        server=server.name,
        tool=tool.name,
        task_id=task_id,
        arguments=arguments,
        body=execute,
        error_result=functools.partial(error_result, tool.name),
        takeover=guard.policy.takeover_for(declares_idempotent(tool.annotations)),
        convert=lambda value: to_guard(tool.convert_result(value)),
    )
    return as_tool_result(answer)


async def stored_task_result(server: FastMCP, tool: Tool, task_id: str) -> CallToolResult | None:
    """The final result of task `task_id`'s body as its record keeps it (`run_task_body`), or
    None (no guard, not finished, in doubt, expired): what a task backend's `tasks/get` can
    inline after a restart, or on another replica sharing the store."""
    middleware = _guarding_middleware(server, tool)
    if middleware is None:
        return None
    return await body_result(middleware.guard, server.name, tool.name, task_id)


async def _guarded_tools(app: object) -> GuardedServer | None:
    """The tools of a FastMCP server its `IdempotencyMiddleware` guards (`reconcile_unknown`),
    under the server's name as the guard sees it (`on_call_tool`); None when `app` is not a
    FastMCP server."""
    if not isinstance(app, FastMCP):
        return None
    found: dict[str, GuardedTool] = {}
    for middleware in app.middleware:
        if not isinstance(middleware, IdempotencyMiddleware):
            continue
        for tool in await app.list_tools(run_middleware=False):
            if tool.name not in found and middleware.guards(tool):

                def convert(value: Any, tool: Tool = tool) -> object:
                    return to_guard(tool.convert_result(value))

                found[tool.name] = GuardedTool(middleware.guard, convert)
    return GuardedServer(app.name, found)


add_finder(_guarded_tools)
