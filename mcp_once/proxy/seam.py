"""FastMCP's per-request seam span, made current without its cost when no OpenTelemetry SDK is
configured.

Why: FastMCP opens a SERVER span for every request at its low-level seam
(`FastMCPServerMiddleware._seam_span`, `fastmcp.server.telemetry.seam_span`). With no SDK
configured (the API's `ProxyTracerProvider`), that span is what the API's no-op tracer hands
back: the non-recording span the request's parent context already carries (the caller's,
extracted from `_meta`, or the current one), made current for the request. Before it gets there
FastMCP builds the span's attributes (the protocol, the caller's token, the session), a tracer
and two generator context managers: the largest single piece of the proxy's per-call CPU left
once the fast path had taken FastMCP's dispatch off a call (benchmarks/README.md, issue 46).

`Seam` makes that same span current directly, so what a request's code sees is what FastMCP
would have given it: the same current span and context, from which the upstream's trace headers
are injected, and the same seam marker (`_active_seam_span`) for FastMCP's later `server_span`.
With an SDK configured (a provider set, or named by `OTEL_PYTHON_TRACER_PROVIDER`), FastMCP's
telemetry mode not `native`, or a parent that is not a non-recording span, FastMCP's own seam
runs. It is decided per request, as FastMCP's tracer itself follows a provider set later.

Only the proxy's own server takes it (`install`): a user's FastMCP server keeps its seam as is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastmcp.server.low_level import FastMCPServerMiddleware
from fastmcp.server.telemetry import _active_seam_span, _get_parent_trace_context
from fastmcp.telemetry import telemetry_mode
from opentelemetry.context import attach, detach
from opentelemetry.trace import (
    NonRecordingSpan,
    ProxyTracerProvider,
    get_current_span,
    get_tracer_provider,
    set_span_in_context,
)

if TYPE_CHECKING:
    from fastmcp import FastMCP
    from mcp.server.context import ServerRequestContext


def install(server: FastMCP[Any]) -> None:
    """Give `server`'s seam (the one `FastMCPServerMiddleware` of its low-level server) the
    light span; fails loudly if FastMCP no longer has one there."""
    seams = [
        mw
        for mw in server._mcp_server.middleware
        if isinstance(mw, FastMCPServerMiddleware) and "_seam_span" not in vars(mw)
    ]
    if len(seams) != 1:
        raise RuntimeError(
            f"{len(seams)} FastMCP seams on {server.name!r}'s low-level server, where FastMCP 4.1"
            " puts one: re-check mcp_once/proxy/seam.py against this FastMCP"
        )
    own = seams[0]._seam_span

    def light(fastmcp: FastMCP[Any] | None, ctx: ServerRequestContext[Any, Any]) -> Any:
        # Evaluated inside the bound request (`__call__`'s `with` enters its items in turn), so
        # the parent context is the request's.
        if (
            fastmcp is not None
            and ctx.request_id is not None
            and isinstance(get_tracer_provider(), ProxyTracerProvider)
            and telemetry_mode() == "native"
        ):
            span = get_current_span(_get_parent_trace_context())
            if isinstance(span, NonRecordingSpan):  # what the no-op tracer hands back as is
                return Seam(span)
        return own(fastmcp, ctx)

    # An instance attribute outranks the method: `__call__` looks it up on `self`.
    seams[0]._seam_span = light  # type: ignore[method-assign]


class Seam:
    """The no-op tracer's span made current for the request, with FastMCP's seam marker (see the
    module doc). A class, not a generator: it is entered once per request."""

    __slots__ = ("_seam_token", "_span", "_span_token")

    def __init__(self, span: NonRecordingSpan) -> None:
        self._span = span

    def __enter__(self) -> None:
        self._span_token = attach(set_span_in_context(self._span))
        self._seam_token = _active_seam_span.set(self._span)

    def __exit__(self, *exc_info: object) -> None:
        _active_seam_span.reset(self._seam_token)
        detach(self._span_token)
