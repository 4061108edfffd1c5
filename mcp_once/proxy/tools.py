"""FastMCP's proxy tools, each sending a guarded call upstream under a key of the record's own.

`OnceProxyProvider` is FastMCP's `ProxyProvider` (listing, resources, prompts, its caches) whose
tools are `OnceProxyTool`s. A call the guard runs (there is a `current_claim()`) goes through the
shared `UpstreamLink` with the upstream key `upstream_key(claim)`: the claim's `downstream_key`
(derived from the record, so scoped to tenant, server and tool; never the caller's raw key),
which names the intent (rule 18). It is the same on every re-send, takeover, release or settle of
one call, so a guarded upstream, or one that reads the key, deduplicates too (where the upstream
ran it after all, its record answers), and new for a deliberate repeat, which the upstream must
run rather than replay. The upstream's input-required round
reaches a 2026-07-28 caller as the tool's `InputRequiredToolResult` (the guard releases the claim
for it: a question is never stored) and the caller's answers go upstream with the continuation,
under the same upstream key. A call whose request declared the tasks extension goes upstream
declaring it too, and the task the upstream created is the result the guard stores
(`tasks.py`). A call the guard does not run (pass-through, or unprotected) is FastMCP's own
proxy call, untouched (rule 14), unless its caller declared the tasks extension: then it goes
on the link's task-declaring session, its answer (a task too) unstored.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from fastmcp.server.context import Context
from fastmcp.server.dependencies import get_context
from fastmcp.server.providers import proxy as fastmcp_proxy
from fastmcp.server.providers.proxy import ProxyProvider, ProxyTool
from fastmcp.tools.base import Tool, ToolResult
from mcp import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult, InputRequiredResult
from pydantic import ValidationError

from idempotency import Claim, current_claim
from idempotency.fastmcp import as_tool_result
from orchestrator import NotExecuted, OutcomeUnknown, TaskCreated, ToolCallError

from .failures import (
    UpstreamLost,
    UpstreamNotSent,
    UpstreamRefused,
    UpstreamUnreachable,
    upstream_lost,
)
from .forwarding import progress_relay
from .tasks import declares_tasks
from .upstream import UpstreamLink

logger = logging.getLogger("mcp_once.proxy")

#: Prefix of the key the upstream receives, so an operator reading the upstream's records can tell
#: where it came from.
UPSTREAM_KEY_PREFIX = "mcp-once:"


def upstream_key(claim: Claim) -> str:
    """The key the upstream gets for a claim: its intent's downstream key (the record's hashed
    name for the record's first intent, as before intents were told apart)."""
    return UPSTREAM_KEY_PREFIX + claim.downstream_key


class OnceProxyTool(ProxyTool):
    """A proxied tool whose guarded calls go through the `UpstreamLink`."""

    _link: UpstreamLink | None = None
    _resend: bool = False

    @classmethod
    def adopt(cls, tool: ProxyTool, link: UpstreamLink, resend: bool) -> OnceProxyTool:
        """`tool` as one of ours (same definition, same client factory)."""
        fields = {name: getattr(tool, name) for name in type(tool).model_fields}
        make: Any = cls  # ProxyTool's own __init__ takes the factory first (pydantic's does not)
        adopted: OnceProxyTool = make(tool._client_factory, **fields)
        adopted._backend_name = tool._backend_name
        adopted._link = link
        adopted._resend = resend
        return adopted

    async def run(  # type: ignore[override]  # a task's creation answers with the task
        self, arguments: dict[str, Any], context: Context | None = None
    ) -> ToolResult | TaskCreated:
        link = self._link
        if link is None:
            return await super().run(arguments, context)
        ctx = context or get_context()
        # The upstream's log lines and questions reach this call's caller while it runs
        # (`forwarding.py`); a replay never gets here, so it carries the result only.
        with link.forwarding.serving(ctx):
            claim = current_claim()
            if claim is not None:
                return await self._guarded(link, claim, arguments, ctx)
            if declares_tasks(ctx) and link.upstream.url is not None:
                return await self._passed_task(link, arguments, ctx)
            # FastMCP's own run, once more if the upstream forgot the link's session.
            return await link.once_more_if_gone(functools.partial(super().run, arguments, ctx))

    async def _passed_task(
        self, link: UpstreamLink, arguments: dict[str, Any], ctx: Context
    ) -> ToolResult | TaskCreated:
        """A call the proxy does not claim, whose caller declared the tasks extension: sent on
        with the declaration (`UpstreamLink.pass_task`), so the upstream may task it; its task
        (or result, or question) as it came, nothing stored (rule 14)."""
        name = self._backend_name or self.name
        meta = fastmcp_proxy._session_request_meta(fastmcp_proxy._forwardable_request_meta(ctx))
        result = await link.pass_task(
            name,
            arguments,
            meta,
            schema=self.parameters,
            progress=progress_relay(ctx.request_context),
            input_responses=ctx.input_responses,
            request_state=ctx.request_state,
        )
        return tool_result(result)

    async def _guarded(
        self, link: UpstreamLink, claim: Claim, arguments: dict[str, Any], ctx: Context
    ) -> ToolResult | TaskCreated:
        """The call sent upstream under the record's own key, its failures in the guard's terms."""
        name = self._backend_name or self.name
        # The upstream's progress reaches the caller of the first execution (a replay has none).
        progress = progress_relay(ctx.request_context)
        with in_guard_terms(name, claim, stdio=link.upstream.url is None):
            # A 2026-07-28 caller's round is its own to answer: the upstream's question goes back
            # to it (the guard releases the claim, rule 8), its answers come back with the key.
            result = await link.call(
                name,
                arguments,
                upstream_key(claim),
                resend=self._resend,
                progress=progress,
                input_responses=ctx.input_responses,
                request_state=ctx.request_state,
                task=declares_tasks(ctx),
            )
        # A task is the record's answer (rule 23): the guard keeps it in its one form
        # (`idempotency.task_record`) and answers every re-send of the key with it.
        return tool_result(result)


@contextmanager
def in_guard_terms(name: str, claim: Claim, *, stdio: bool) -> Iterator[None]:
    """The link's failures of a guarded call (`UpstreamLink.call`, or one raw attempt judged by
    `orchestrator.attempt_once`: the fast path's) raised in the guard's terms: `lost` (may have
    run: UNKNOWN), `unreadable`, `UpstreamNotSent` (not run: released, -32013), `refused`."""
    try:
        yield
    except OutcomeUnknown as exc:
        raise lost(name, claim, exc, stdio=stdio) from exc
    except ValidationError as exc:
        raise unreadable(name, claim, exc, stdio=stdio) from exc
    except NotExecuted as exc:
        _said(logging.DEBUG, name, claim, exc)
        unsent = "could not be reached; not run, released, the caller may retry (-32013)"
        _said(logging.WARNING, name, claim, None, unsent)
        raise UpstreamNotSent(str(exc.reason)) from exc
    except ToolCallError as exc:
        raise refused(name, claim, exc) from exc


def lost(name: str, claim: Claim, exc: OutcomeUnknown, *, stdio: bool) -> UpstreamLost:
    """What a guarded call the link gave up on as maybe executed raises (here, and on the fast
    path's raw send): nothing more will come of it, so the record turns UNKNOWN now, not at the
    lease's end (an `upstream_idempotent` tool's is left for a takeover). The guard logs it (one
    WARNING naming the record and tool); the cause goes to DEBUG."""
    _said(logging.DEBUG, name, claim, exc)
    return upstream_lost(exc, stdio=stdio)


def unreadable(name: str, claim: Claim, exc: ValidationError, *, stdio: bool) -> UpstreamLost:
    """What a guarded call raises whose upstream answered with a result that is not MCP's (the
    session's wire check failed; here, and on the fast path's raw send): it may have run, and
    its answer can be neither passed on nor stored, so the record turns UNKNOWN. Left as it was,
    FastMCP would take the pydantic error for the caller's invalid arguments and the guard would
    release the claim: a re-send would run the effect again."""
    gave_up = OutcomeUnknown(
        tool=name, key=upstream_key(claim), attempts=1, last_error=exc, reason="attempts"
    )
    return lost(name, claim, gave_up, stdio=stdio)


def refused(name: str, claim: Claim, exc: MCPError) -> UpstreamRefused:
    """What a guarded call the upstream answered with a JSON-RPC error raises (here, and on the
    fast path's raw send): released, the error passed on as sent, one INFO line."""
    _said(logging.DEBUG, name, claim, exc)
    what = f"refused the call with code {exc.code}; passed on, nothing stored"
    _said(logging.INFO, name, claim, None, what)
    return UpstreamRefused(exc)


def tool_result(
    result: CallToolResult | InputRequiredResult | TaskCreated,
) -> ToolResult | TaskCreated:
    """The upstream's answer as the front's tool returns it: a task as it came
    (`tasks.producing_tasks` sends it), a question as FastMCP carries one (its wire handler
    unwraps it), a result as it came (`as_tool_result`: the session already validated it, and
    `ToolResult`'s constructor would copy what is JSON already, a walk of the whole structured
    content per call, ~50 µs for 6 KB; benchmarks/README.md, issue 46)."""
    if isinstance(result, TaskCreated):
        return result
    return as_tool_result(result)


def _said(
    level: int, name: str, claim: Claim, exc: BaseException | None, what: str = "call failed"
) -> None:
    """One line about the record of an upstream call (its store key's first 12 hex digits, as
    the guard names records): each outcome is one line at its own level, the traceback behind
    it (`exc`) at DEBUG only."""
    record = claim.record[:12]
    logger.log(level, "record %s (tool %r): the upstream %s", record, name, what, exc_info=exc)


class OnceProxyProvider(ProxyProvider):
    """FastMCP's proxy provider, listing `OnceProxyTool`s.

    `resend(name)` says whether the proxy's policy declares an upstream tool idempotent.

    FastMCP lists the upstream on every `tools/list`, and over a 2026-07-28 HTTP front before
    every `tools/call` with arguments too (the SDK checks `Mcp-Param-*` headers against the tool's
    listed schema). Our tools are adopted once per distinct listing: while the upstream lists the
    same tools, the same `OnceProxyTool`s are served again; a listing that differs in anything (a
    tool added, removed or changed, as after the upstream's `list_changed`) is adopted afresh.

    `on_first_listing` is called with the tool names of the first listing that succeeds (at
    start, or later when the upstream was unreachable then); `on_listing` with the output
    schemas of each distinct listing adopted (`build_proxy`)."""

    def __init__(
        self,
        link: UpstreamLink,
        resend: Any,
        on_first_listing: Callable[[list[str]], None] | None = None,
        on_listing: Callable[[dict[str, dict[str, Any]]], None] | None = None,
    ) -> None:
        super().__init__(link.client)
        self._link = link
        self._resend = resend
        self._on_first_listing = on_first_listing
        self._on_listing = on_listing
        #: The last listing as FastMCP built it, and our tools adopted from it.
        self._listed: Sequence[Tool] = ()
        self._adopted: list[Tool] = []

    async def _list_tools(self) -> Sequence[Tool]:
        try:
            listed = await super()._list_tools()
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise
            # The session died under the listing (a stdio child killed after the link last saw
            # it alive): retryable, and the next listing goes to the session that replaces it.
            raise UpstreamUnreachable() from exc
        if listed != self._listed:  # pydantic compares every field of every tool
            self._adopted = [
                OnceProxyTool.adopt(t, self._link, bool(self._resend(t.name)))
                if isinstance(t, ProxyTool)
                else t
                for t in listed
            ]
            self._listed = listed
            if self._on_listing is not None:
                self._on_listing({t.name: t.output_schema for t in listed if t.output_schema})
        if self._on_first_listing is not None:
            first, self._on_first_listing = self._on_first_listing, None
            first([t.name for t in listed])
        cache = self._tools_cache
        if cache is not None:
            cache.items = self._adopted
        return list(self._adopted)  # a copy: the caller may edit its list
