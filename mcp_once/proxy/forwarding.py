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
upstream) rather than sent to a caller it may not belong to. Progress is routed by its token and
is not concerned. A replay never reaches the upstream, so it carries the result only.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from fastmcp.server.context import Context
from fastmcp.server.dependencies import fastmcp_request_ctx, get_context
from fastmcp.server.providers import proxy as fastmcp_proxy
from mcp import MCPError
from mcp_types import INTERNAL_ERROR

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
