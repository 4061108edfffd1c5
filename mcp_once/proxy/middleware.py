"""`ProxyGuardMiddleware`: the FastMCP middleware in front of the proxied tools.

The guard itself is `IdempotencyMiddleware`, unchanged (same options, rules and errors); this
module only chooses, per tool, which one: the policy file gives each tool its own options, so each
distinct set of options gets one `IdempotencyMiddleware` (all on the same store), and a tool the
policy or its `readOnlyHint` passes through gets none. A task-augmented call is guarded as any
call is, the task it created stored and answered as its `CreateTaskResult` (`tasks.py`; each
guarded tool's listing names what stays unstored in its `io.github.mcp-once/proxy` `_meta`
entry); every task handed out, guarded or passed through, is recorded as its caller's first
(`task_owners.py`). Failures of the upstream that the guard released (never sent, the upstream's own
JSON-RPC error) reach the caller as `failures.py` says.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from typing import Any

from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import Tool, ToolResult
from mcp import MCPError
from mcp_types import CallToolRequestParams, ListToolsRequest
from pydantic import BaseModel

from idempotency import KeyStore, PolicyOptions, wire
from idempotency.fastmcp import IdempotencyMiddleware
from mcp_once._upstream.outputs import output_problem

from .failures import EFFECT_FREE, caller_error
from .policy import ProxyPolicy, ToolPolicy
from .task_owners import TaskOwners
from .tasks import declares_tasks, plain_resend

logger = logging.getLogger("mcp_once.proxy")

_CallContext = MiddlewareContext[CallToolRequestParams]
_CallNext = CallNext[CallToolRequestParams, ToolResult]

#: What the listing tells a client of each guarded tool: calls the proxy does not guard (none:
#: a task-augmented call is guarded, its task stored, `tasks.py`) and answers it never stores (an
#: input_required round is a question).
UNGUARDED: dict[str, tuple[str, ...]] = {
    "unguarded": (),
    "neverStored": ("inputRequired",),
}


#: How many tools' choices (the guard by name and listed read-only, the re-send by name) are
#: kept, the least recently used dropped first: the policy is fixed, so each is worked out once
#: per tool, not on every listing and call, and an upstream that keeps listing new names cannot
#: grow them.
_CHOSEN_MAX = 1024


async def _only(tools: list[Tool], _: MiddlewareContext[ListToolsRequest]) -> Sequence[Tool]:
    """A `call_next` listing just `tools`: each guard's tools go through that guard's listing."""
    return tools


def _read_only(tool: Tool) -> bool:
    return bool(tool.annotations is not None and tool.annotations.read_only_hint)


def _replayed(result: ToolResult) -> bool:
    marker = (result.meta or {}).get(wire.IDEMPOTENCY_META)
    return isinstance(marker, dict) and marker.get("status") == "replayed"


def _marked(tool: Tool) -> Tool:
    """`tool` as listed with the proxy's `_meta` entry (a fresh copy: a listing is the caller's)."""
    entry = {name: list(values) for name, values in UNGUARDED.items()}
    return tool.model_copy(update={"meta": {**(tool.meta or {}), wire.PROXY_META: entry}})


class ProxyGuardMiddleware(Middleware):
    """Guards each proxied tool as the policy says; see the module doc."""

    def __init__(self, store: KeyStore, policy: ProxyPolicy | None = None, **defaults: Any) -> None:
        self.store = store
        self.policy = policy or ProxyPolicy()
        self._defaults: dict[str, Any] = dict(defaults)
        self._guards: dict[str, IdempotencyMiddleware] = {}
        #: `guard_of`'s and `resend`'s choices, kept (see `_CHOSEN_MAX`).
        self._chosen = functools.lru_cache(maxsize=_CHOSEN_MAX)(self._choose)
        self._resends = functools.lru_cache(maxsize=_CHOSEN_MAX)(self._may_resend)
        #: How `keys settle` names this proxy's records (`build_proxy` sets `--proxy NAME`).
        self.settle_with = ""
        #: Who owns each task handed out (`build_proxy` sets it; None: not recorded).
        self.task_owners: TaskOwners | None = None
        self._plain = self._guard_for(ToolPolicy())  # the default options fail here, at start
        for rule in self.policy.rules:  # and each table's, before any listing (which may wait)
            self._guard_for(self.policy.for_tool(rule.pattern))

    def check(self, names: Sequence[str]) -> list[str]:
        """Build every listed tool's guard now (bad options fail at start-up) and return the
        policy's patterns that match none of `names`."""
        for name in names:
            self._guard_for(self.policy.for_tool(name))
        return self.policy.unmatched(names)

    def _guard_for(self, tool: ToolPolicy) -> IdempotencyMiddleware:
        options: dict[str, Any] = {**self._defaults, **tool.guard_options()}
        options["effect_free"] = EFFECT_FREE
        label = json.dumps(
            {k: v for k, v in options.items() if k != "effect_free"}, sort_keys=True, default=repr
        )
        guard = self._guards.get(label)
        if guard is None:
            typed: PolicyOptions = options  # type: ignore[assignment]  # checked by make_policy
            guard = self._guards[label] = IdempotencyMiddleware(self.store, **typed)
        return guard

    def resend(self, name: str) -> bool:
        """Whether the policy lets the proxy re-send a maybe-executed call of `name`."""
        return self._resends(name)

    def _may_resend(self, name: str) -> bool:
        return self.policy.for_tool(name).upstream_idempotent

    def guard_of(self, tool: Tool) -> IdempotencyMiddleware | None:
        """The guard of `tool`'s calls; None when they pass through."""
        return self._chosen(tool.name, _read_only(tool))

    def _choose(self, name: str, read_only: bool) -> IdempotencyMiddleware | None:
        rule = self.policy.for_tool(name)
        return self._guard_for(rule) if rule.guarded(read_only) else None

    async def on_list_tools(
        self,
        context: MiddlewareContext[ListToolsRequest],
        call_next: CallNext[ListToolsRequest, Sequence[Tool]],
    ) -> Sequence[Tool]:
        listed = list(await call_next(context))
        # Each guard lists its own tools, in one pass; every tool keeps its place.
        places: dict[int, tuple[IdempotencyMiddleware, list[int]]] = {}
        for index, tool in enumerate(listed):
            guard = self.guard_of(tool)
            if guard is not None:
                places.setdefault(id(guard), (guard, []))[1].append(index)
        for guard, indices in places.values():
            own = [listed[i] for i in indices]
            advertised = await guard.on_list_tools(context, functools.partial(_only, own))
            for index, tool in zip(indices, advertised, strict=True):
                listed[index] = _marked(tool)
        return listed

    async def on_call_tool(  # type: ignore[override]  # a task's answer is no ToolResult
        self, context: _CallContext, call_next: _CallNext
    ) -> ToolResult | BaseModel:
        """The call under its tool's guard (or passed through), upstream failures mapped; a
        task-augmented call's stored task answered as the `CreateTaskResult` (`tasks.py`)."""
        ctx = context.fastmcp_context
        tool = None if ctx is None else await ctx.fastmcp.get_tool(context.message.name)
        return await self.call(tool, context, call_next)

    async def call(
        self, tool: Tool | None, context: _CallContext, call_next: _CallNext
    ) -> ToolResult | BaseModel:
        """`on_call_tool` for the call of `tool`, already looked up (None: FastMCP finds none);
        the fast path's entry (`fast_path.py`), which has looked it up."""
        ctx = context.fastmcp_context
        guard = None if tool is None else self.guard_of(tool)
        try:
            if guard is None:
                result: ToolResult | BaseModel = await call_next(context)
            else:
                result = await guard.on_call_tool(context, call_next)
        except Exception as exc:
            error = caller_error(exc)
            if error is None:
                raise
            raise error from exc
        if not isinstance(result, ToolResult):  # the answer is a task (rule 23, `tasks.py`)
            if guard is not None and not declares_tasks(ctx):
                assert tool is not None
                raise plain_resend(tool.name, result)
            if self.task_owners is not None:  # handed out to its owner only (`task_owners`)
                await self.task_owners.record(result)
            return result
        if guard is None:
            return result
        assert tool is not None
        if tool.output_schema is not None and _replayed(result):
            self._check_output(tool.name, tool.output_schema, result)
        return result

    def _check_output(self, name: str, schema: dict[str, Any], result: ToolResult) -> None:
        """A replayed answer the caller's SDK would reject (an operator's settle of another
        shape, an upstream whose schema changed since, or an upstream's own first answer that
        did not fit the schema it lists: that one was passed on as sent, `fast_path`) is
        refused with what to do, instead of reaching the caller as its SDK's "Invalid structured
        content". The record does not say which, so the message names each."""
        found = output_problem(schema, result.structured_content, is_error=result.is_error)
        if found is None:
            return
        marker = (result.meta or {}).get(wire.IDEMPOTENCY_META)
        key = marker.get("key") if isinstance(marker, dict) else None
        logger.warning(
            "tool %r: a stored answer does not fit its output schema (%s); refused (-32014)",
            name,
            found,
        )
        raise MCPError(
            wire.CORRUPT_RECORD,
            f"The stored answer for this idempotency key (data.key) of tool {name!r} cannot be"
            f" given: {found}, so the caller's MCP SDK would reject it. Nothing was run. Either"
            " it is the upstream's own answer, which did not fit the schema the upstream lists"
            " (it was passed on as sent the first time, and the caller's SDK judged it then),"
            " or the record was settled by an operator in another shape. Settle it again,"
            f" `mcp-once keys settle{self.settle_with} --tool {name} --client-key KEY --force"
            " --result-json FILE` with a CallToolResult whose structuredContent matches the"
            " schema (or --failed, to let the next call run the tool). Do not retry until then.",
            {"key": key, "tool": name, "reason": "stored answer does not fit the output schema"},
        )

    async def on_notification(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        # Cancellations mark answers undelivered in the store, whichever guard gave them.
        return await self._plain.on_notification(context, call_next)
