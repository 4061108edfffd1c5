"""Who gets what the upstream sends besides a call's answer: its log lines and its sampling,
elicitation and roots requests.

FastMCP's `ProxyClient` forwards them to "the proxy's current request", which its own proxy
tools stash on the client before each call (`_stash_proxy_request_context`). Our guarded calls go
through the `UpstreamLink` instead, so nothing was stashed for them and their upstream's log lines
and questions were lost. And one stash slot on a session every caller shares would hand a call's
question to whichever call stashed last: another caller, maybe another tenant.

So the link's client gets handlers of ours (`Forwarding.client_options`): each call through a
proxied tool, guarded or passed through, is registered while it runs (`Forwarding.serving`), and a
message the upstream sends goes to the caller of the one call in flight, through FastMCP's own
forwarding handlers. A stdio upstream (and a 2025-era HTTP one outside a request's stream) does
not say which request a log line or a request belongs to; with several calls in flight, or none,
it cannot be told, so it is not forwarded at all (a log line is dropped, a request refused to the
upstream) rather than sent to a caller it may not belong to. A replay never reaches the upstream,
so it carries the result only.

Progress is routed by its token, not by the call in flight: the link's session asks the upstream
with a token of its own and hands each `notifications/progress` to the callback of the request it
names, which `progress_relay` binds to the caller's request when the call is sent. Bound then,
not looked up when the notification comes: the SDK runs that callback in the context of the task
that read the notification, which over HTTP is the call's own (its answer stream) but over stdio
is the pipe reader's, where no caller's request is bound, so FastMCP's `Context.report_progress`
found no token there and dropped every notification (issue 46).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from fastmcp.server.context import Context
from fastmcp.server.dependencies import fastmcp_request_ctx, get_context
from fastmcp.server.providers import proxy as fastmcp_proxy
from mcp import MCPError
from mcp_types import INTERNAL_ERROR

if TYPE_CHECKING:
    from fastmcp.server.dependencies import FastMCPRequestContext
    from mcp.shared.dispatcher import ProgressFnT

logger = logging.getLogger("mcp_once.proxy")

#: What FastMCP's forwarding handlers restore before they relay: (request context, weakref to
#: the server), as `_stash_proxy_request_context` stashes it.
_Stash = tuple[Any, Any]
_Handler = Callable[..., Awaitable[Any]]


class Forwarding:
    """The calls in flight on one upstream link, and the client handlers that route to them."""

    def __init__(self) -> None:
        self._serving: dict[int, _Stash] = {}
        self._ids = itertools.count()

    def serving(self, ctx: Context) -> AbstractContextManager[None]:
        """Register the call of `ctx` as in flight for the block."""
        return self.serving_request(ctx.request_context, ctx._fastmcp)

    @contextmanager
    def serving_request(self, request_context: Any, server: Any) -> Iterator[None]:
        """Register the call of `request_context` (FastMCP's, on the server `server`: a weakref
        to it) as in flight for the block (the fast path has no `Context`)."""
        number = next(self._ids)
        self._serving[number] = (request_context, server)
        try:
            yield
        finally:
            del self._serving[number]

    @property
    def in_flight(self) -> int:
        return len(self._serving)

    def _only(self) -> _Stash | None:
        if len(self._serving) != 1:
            return None
        return next(iter(self._serving.values()))

    def client_options(self) -> dict[str, Any]:
        """`ProxyClient` keyword arguments: FastMCP's forwarding handlers, each routed to the
        caller of the one call in flight."""
        return {
            "log_handler": self._relay(fastmcp_proxy.default_proxy_log_handler, "a log line"),
            "sampling_handler": self._relay(
                fastmcp_proxy.default_proxy_sampling_handler, "a sampling request"
            ),
            "elicitation_handler": self._relay(
                fastmcp_proxy.default_proxy_elicitation_handler, "an elicitation request"
            ),
            "roots": self._relay(fastmcp_proxy.default_proxy_roots_handler, "a roots request"),
        }

    def _relay(self, handler: _Handler, what: str) -> _Handler:
        is_log = handler is fastmcp_proxy.default_proxy_log_handler

        async def relay(*args: Any, **kwargs: Any) -> Any:
            target = self._only()  # read before any await: the call may end meanwhile
            if target is None:
                calls = self.in_flight
                why = (
                    f"the upstream sent {what} while {calls} calls were in flight on its"
                    " session; it cannot be told whose it is, so it was not forwarded"
                )
                if is_log:
                    # Between calls (a chatty upstream's idle lines) nobody loses anything.
                    logger.log(logging.WARNING if calls else logging.DEBUG, "%s", why)
                    return None
                raise MCPError(INTERNAL_ERROR, f"mcp-once proxy: {why}")
            # FastMCP's own restore (what its proxy tools' stash feeds): the handler then
            # resolves `get_context()` to this call's request, on the caller's session. A
            # message read in the call's own task context (an HTTP upstream's answer stream,
            # opened by the fast path's raw send) has the request bound but no `Context`, which
            # the restore would keep: unbound first, the restore binds both.
            try:
                get_context()
            except RuntimeError:
                fastmcp_request_ctx.set(None)
            fastmcp_proxy._restore_request_context([target])
            return await handler(*args, **kwargs)

        return relay


def progress_relay(request: FastMCPRequestContext | None) -> ProgressFnT | None:
    """Where the upstream's progress for a call of `request` goes: to its caller, under the
    caller's own token, as FastMCP's `Context.report_progress` sends it (related to the caller's
    request, so over HTTP it takes that request's stream). None when the caller did not ask
    (no token): the upstream is then not asked either."""
    meta = None if request is None else request._srctx.meta
    token = None if meta is None else meta.get("progress_token")
    if request is None or token is None:
        return None
    session, request_id = request.session, request.request_id

    async def relay(progress: float, total: float | None, message: str | None) -> None:
        await session.send_progress_notification(
            progress_token=token,
            progress=progress,
            total=total,
            message=message,
            related_request_id=request_id,
        )

    return relay
