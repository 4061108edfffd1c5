"""Spans as a real OpenTelemetry SDK records them: one in-memory exporter for the test process.

The global tracer provider can be set once per process; every tracer handed out before (the
guard's, FastMCP's: API proxies) follows it. `recorded()` clears what earlier tests left.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter: list[InMemorySpanExporter] = []


def recorder() -> InMemorySpanExporter:
    """The process's span exporter, emptied."""
    if not _exporter:
        provider = TracerProvider()
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _exporter.append(exporter)
    _exporter[0].clear()
    return _exporter[0]


@dataclass(frozen=True)
class Shape:
    """A span as two runs of the same call compare it: not ids, times or attribute values."""

    name: str
    kind: str
    status: str
    parent: str | None


def shapes(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> list[Shape]:
    """The spans' names, kinds, statuses and parents' names, in a stable order."""
    names = {span.context.span_id: span.name for span in spans if span.context is not None}
    found = [
        Shape(
            name=span.name,
            kind=span.kind.name,
            status=span.status.status_code.name,
            parent=None if span.parent is None else names.get(span.parent.span_id, "<remote>"),
        )
        for span in spans
    ]
    return sorted(found, key=lambda s: (s.name, s.kind, s.status, s.parent or ""))
