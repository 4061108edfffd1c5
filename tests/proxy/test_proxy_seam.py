"""The proxy's request seam (`mcp_once/proxy/seam.py`): with no OpenTelemetry SDK, the span
FastMCP's seam would make current, made current without FastMCP's cost.

Each case enters the proxy's seam and FastMCP's own for the same request and holds what a
request's code sees equal: the current span's context, the whole current context's trace and
baggage as injected upstream, the seam marker FastMCP's `server_span` reads, the context after
the request (also when it fails). With an SDK configured FastMCP's own seam runs, recorded as
its span. The FastMCP and OpenTelemetry code the seam stands in for is pinned.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import fastmcp.server.telemetry as fastmcp_telemetry
import opentelemetry.trace as otel_trace
import pytest
from fastmcp import FastMCP
from fastmcp.server.dependencies import bind_request_context
from fastmcp.server.low_level import FastMCPServerMiddleware
from mcp.server.context import ServerRequestContext
from opentelemetry import baggage, propagate
from opentelemetry import context as otel_context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from otel_spans import recorder
from proxy_kit import source_hashes

from idempotency import MemoryKeyStore
from mcp_once._upstream import Upstream
from mcp_once.proxy import build_gateway, build_proxy
from mcp_once.proxy.seam import Seam

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
AMBIENT = SpanContext(
    trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
    span_id=0x00F067AA0BA902B7,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
)


def _proxy() -> FastMCP[Any]:
    # Never opened: the seam needs only the server (no upstream is started).
    return build_proxy(Upstream.stdio("true"), MemoryKeyStore())


def _seam_of(server: FastMCP[Any]) -> FastMCPServerMiddleware:
    (found,) = [
        mw for mw in server._mcp_server.middleware if isinstance(mw, FastMCPServerMiddleware)
    ]
    return found


def _request(meta: dict[str, Any] | None, request_id: int | None = 1) -> ServerRequestContext:
    params: dict[str, Any] = {"name": "write", "arguments": {}}
    if meta is not None:
        params["_meta"] = meta
    return ServerRequestContext(
        session=cast(Any, None),
        lifespan_context={},
        protocol_version="2025-11-25",
        method="tools/call" if request_id is not None else "notifications/progress",
        params=params,
        request_id=request_id,
    )


def _seen() -> dict[str, Any]:
    """What a request's code sees of the trace: the current span's context, what goes upstream
    (traceparent, tracestate, baggage), the baggage, and whether the seam marker is the span."""
    span = otel_trace.get_current_span()
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {
        "span": span.get_span_context(),
        "recording": span.is_recording(),
        "injected": carrier,
        "baggage": dict(baggage.get_all()),
        "marker": fastmcp_telemetry._active_seam_span.get() is span,
    }


@contextmanager
def _ambient(span: bool, bag: bool) -> Iterator[None]:
    """A context the request arrives in (as HTTP propagation would leave it)."""
    context = otel_context.get_current()
    if span:
        context = otel_trace.set_span_in_context(NonRecordingSpan(AMBIENT), context)
    if bag:
        context = baggage.set_baggage("tenant", "ambient", context)
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


def _through(seam: Any, server: FastMCP[Any], ctx: ServerRequestContext, fail: bool) -> Any:
    """Enter `seam` as `FastMCPServerMiddleware.__call__` does (inside the bound request) and
    return what the request saw and what was current after it."""
    before = otel_context.get_current()
    seen: dict[str, Any] = {}
    try:
        with bind_request_context(ctx), seam(server, ctx):
            seen = _seen()
            if fail:
                raise LookupError("the handler failed")
    except LookupError as error:
        seen["raised"] = str(error)
    return seen, otel_context.get_current() == before


CASES = {
    "no meta": None,
    "traceparent": {"traceparent": PARENT},
    "traceparent and baggage": {"traceparent": PARENT, "baggage": "tenant=acme,plan=pro"},
    "traceparent and tracestate": {"traceparent": PARENT, "tracestate": "vendor=x"},
    "a malformed traceparent": {"traceparent": "00-nothex-01"},
    "other meta only": {"user_id": "ann", "progressToken": 3},
}


@pytest.mark.parametrize("fail", [False, True], ids=["answered", "failed"])
@pytest.mark.parametrize(("ambient_span", "ambient_bag"), [(False, False), (True, True)])
@pytest.mark.parametrize("meta", CASES.values(), ids=CASES.keys())
def test_without_an_sdk_the_request_sees_what_fastmcp_s_seam_shows_it(
    meta: dict[str, Any] | None,
    ambient_span: bool,
    ambient_bag: bool,
    fail: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No SDK configured (the API's proxy provider, whatever an earlier test set): the proxy's
    seam and FastMCP's give the request the same trace context, injected upstream the same,
    and leave the context as they found it; the light seam is the one taken."""
    monkeypatch.setattr(otel_trace, "_TRACER_PROVIDER", None)
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    server = _proxy()
    middleware = _seam_of(server)
    theirs = type(middleware)._seam_span.__get__(middleware)
    taken: list[Seam] = []
    ours = middleware._seam_span

    def spied(fastmcp: Any, ctx: ServerRequestContext) -> Any:
        seam = ours(fastmcp, ctx)
        if isinstance(seam, Seam):  # the light seam; FastMCP's own otherwise
            taken.append(seam)
        return seam

    with _ambient(ambient_span, ambient_bag):
        expected = _through(theirs, server, _request(meta), fail)
        got = _through(spied, server, _request(meta), fail)
        assert got == expected
        assert len(taken) == 1, "FastMCP's seam served it, not the light one"
        assert got[0]["recording"] is False


def test_a_notification_and_an_sdk_go_fastmcp_s_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """A notification has no seam span (FastMCP's rule, kept by its own code); with an SDK the
    request's span is FastMCP's, recorded, with its seam marker."""
    exporter = recorder()
    server = _proxy()
    middleware = _seam_of(server)
    seen, restored = _through(middleware._seam_span, server, _request(None, None), False)
    assert restored and seen["recording"] is False and exporter.get_finished_spans() == ()
    seen, restored = _through(
        middleware._seam_span, server, _request({"traceparent": PARENT}), False
    )
    assert restored and seen["recording"] is True and seen["marker"] is True
    (span,) = exporter.get_finished_spans()
    assert span.name == "tools/call" and span.attributes is not None
    assert span.attributes[fastmcp_telemetry.SEAM_SPAN_MARKER] is True
    assert span.parent is not None and f"{span.parent.trace_id:032x}" in PARENT


def test_a_user_s_fastmcp_server_keeps_its_own_seam() -> None:
    """Only the proxy's own servers take the light seam: a proxy's, a gateway's front."""
    assert "_seam_span" not in vars(_seam_of(FastMCP("theirs")))
    assert "_seam_span" in vars(_seam_of(_proxy()))
    upstreams = [Upstream.stdio("true", name="a"), Upstream.stdio("true", name="b")]
    assert "_seam_span" in vars(_seam_of(build_gateway(upstreams, MemoryKeyStore())))


#: sha256 of the pinned code `seam.Seam` stands in for: FastMCP's (4.1.6) seam and the
#: OpenTelemetry API's no-op tracer, whose span it makes current.
PINNED = {
    "FastMCPServerMiddleware._seam_span": (
        "72d32b39faa2771546394892e4642271131fed6efac1c8fc13472ebb53a6fa41"
    ),
    "FastMCPServerMiddleware.__call__": (
        "1f404a80705ab15e8099404e6fcbc31f9c2313c03dc45861595260d03baff019"
    ),
    "telemetry.seam_span": "b276d2446772fea0998599e48b612c83a127b10fb61d0747d1b6fd24eb9f8314",
    "telemetry._get_parent_trace_context": (
        "5d9016985e2377d49bf175cb4bfe401e7a762053117981615c07dd74089bf61f"
    ),
    "NoOpTracer.start_span": "c2d6354c65a82c06ef4d0d72e542f2d88b94573fdc044595445eb288e7c1b897",
    "NoOpTracer.start_as_current_span": (
        "ac0a0cf6c9911d67ebfcc00c2decc76deef13b81c06a99d83f880c32b3aa7a18"
    ),
    "trace.use_span": "51a3cc4f931b87fbf13ae1cfc508a38361eb9d6a5b746262c383779bfb4d9a03",
}


def test_the_code_the_seam_stands_in_for_is_the_pinned_code() -> None:
    """A FastMCP or OpenTelemetry release that changes the seam, or what the no-op tracer makes
    current, fails here: re-check `mcp_once/proxy/seam.py` against it, then update PINNED."""
    owners: dict[str, Any] = {
        "FastMCPServerMiddleware": FastMCPServerMiddleware,
        "telemetry": fastmcp_telemetry,
        "NoOpTracer": otel_trace.NoOpTracer,
        "trace": otel_trace,
    }
    assert source_hashes(owners, PINNED) == PINNED, (
        "the code mcp_once/proxy/seam.py stands in for changed: re-check Seam against it,"
        " then update PINNED"
    )
