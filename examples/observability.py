"""What mcp-once tells OpenTelemetry of one retried call: `uv run python examples/observability.py`.

One process holds a guarded server and a client, over streamable HTTP on 127.0.0.1 (a free
port), so the trace crosses the wire as it does between processes. The payment provider is
slow (1 s) and the client waits 0.6 s per attempt: the first attempt times out, the client
retries under the same key, the guard (which ran on) answers the retry from its record. Every
span, metric and log line of that is printed as the OpenTelemetry SDK exports it — spans and
metrics to the console, metrics again in Prometheus' text format — then the span tree. The
order, the amount, the receipt and the key appear in none of them (tests/examples checks it).

Needs the OpenTelemetry SDK (`opentelemetry-sdk`) and, for the Prometheus part,
`opentelemetry-exporter-prometheus`; both are in the dev group (`uv sync` installs them).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import uvicorn
from mcp import Client
from mcp.server.mcpserver import MCPServer
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from idempotency import MemoryKeyStore, Replay, idempotent
from orchestrator import (
    NotExecuted,
    OutcomeUnknown,
    RetryEvent,
    RetryingSession,
    RetryPolicy,
    streamable_http_transport,
)

# The caller's data: none of it may reach a span, a metric or a log line.
ORDER, CENTS, RECEIPT, KEY = "order-7731", 4242, "receipt-5c0ffee", "checkout-7731-charge"


def one_line(span: ReadableSpan) -> str:
    """A span as the console exporter prints it here: everything it carries, on one line."""
    events = [{"name": e.name, **_short(dict(e.attributes or {}))} for e in span.events]
    return json.dumps(
        {
            "span": span.name,
            "kind": span.kind.name,
            "status": span.status.status_code.name,
            "attributes": dict(span.attributes or {}),
            **({"events": events} if events else {}),
        },
        default=str,
    )


def _short(attributes: dict[str, Any]) -> dict[str, Any]:
    """An `exception` event's stack trace (the SDK records one on its request span when an
    attempt times out) cut to its last line, to keep the output readable."""
    trace_text = attributes.get("exception.stacktrace")
    if isinstance(trace_text, str):
        attributes["exception.stacktrace"] = "... " + trace_text.strip().splitlines()[-1]
    return attributes


def metric_lines(data: MetricsData) -> str:
    """Metrics as the console exporter prints them here: one line per data point."""
    lines = []
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    if value is None:  # a histogram: its count and sum
                        value = f"count={point.count} sum={point.sum:.3f}"  # type: ignore[union-attr]
                    labels = dict(point.attributes or {})
                    lines.append(f"metric {metric.name} [{metric.unit}] {labels} {value}")
    return "\n".join(lines) + "\n"


def tree(spans: Sequence[ReadableSpan]) -> list[str]:
    """The spans as a tree, parents first, with the attributes that tell the story."""
    shown = ("gen_ai.tool.name", "error.type")
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        parent = span.parent.span_id if span.parent is not None else None
        children.setdefault(parent if parent in by_id else None, []).append(span)
    lines: list[str] = []

    def walk(span: ReadableSpan, depth: int) -> None:
        attributes = span.attributes or {}
        notes = [
            f"{name}={_value(attributes[name])}"
            for name in attributes
            if name in shown or name.startswith("mcp_once.")
        ]
        label = f"{span.name} ({span.kind.name.lower()})"
        lines.append("  " * depth + label + (f"  {' '.join(notes)}" if notes else ""))
        assert span.context is not None
        for child in sorted(children.get(span.context.span_id, []), key=_start):
            walk(child, depth + 1)

    for root in sorted(children.get(None, []), key=_start):
        walk(root, 0)
    return lines


def _value(value: object) -> object:
    return f"{value:.3f}" if isinstance(value, float) else value


def _start(span: ReadableSpan) -> int:
    return span.start_time or 0


def build_server() -> MCPServer:
    server = MCPServer("shop")
    store = MemoryKeyStore()

    def on_replay(event: Replay) -> None:
        print(
            f"on_replay: {event.tool} answered from its record, {event.age:.1f} s old,"
            f" {event.executions} execution(s), key from the {event.key_source}"
        )

    @server.tool()
    @idempotent(store, on_replay=on_replay)
    async def charge(order_id: str, cents: int) -> dict[str, Any]:
        """Charge an order (a slow payment provider: 1 s)."""
        await anyio.sleep(1.0)
        return {"order_id": order_id, "cents": cents, "receipt": RECEIPT}

    return server


@asynccontextmanager
async def serving(server: MCPServer) -> AsyncIterator[str]:
    """The server on streamable HTTP, in this event loop; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    app = server.streamable_http_app()
    web = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: web.serve(sockets=[sock]))
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        finally:
            web.should_exit = True
    sock.close()


async def main() -> None:
    spans = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(spans))
    # The console exporter: each span, as it ends. (Without `formatter`, it prints them as JSON.)
    console = ConsoleSpanExporter(out=sys.stdout, formatter=lambda s: one_line(s) + "\n")
    tracing.add_span_processor(SimpleSpanProcessor(console))
    trace.set_tracer_provider(tracing)
    readers: list[Any] = [
        PeriodicExportingMetricReader(
            ConsoleMetricExporter(out=sys.stdout, formatter=metric_lines),
            export_interval_millis=3_600_000,  # exported once, at shutdown
        )
    ]
    exposition: Callable[[], bytes] | None = None
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import REGISTRY, generate_latest

        readers.append(PrometheusMetricReader())
        exposition = functools.partial(generate_latest, REGISTRY)
    except ImportError:
        print("(no opentelemetry-exporter-prometheus: `uv sync` installs it with the dev group)")
    meter_provider = MeterProvider(metric_readers=readers)
    metrics.set_meter_provider(meter_provider)
    # mcp-once's loggers: `idempotency` (server) and `orchestrator` (client); DEBUG shows every
    # attempt and retry.
    logging.basicConfig(
        stream=sys.stdout, format="log %(levelname)s %(name)s: %(message)s", level=logging.WARNING
    )
    for name in ("idempotency", "orchestrator"):
        logging.getLogger(name).setLevel(logging.DEBUG)

    def on_retry(event: RetryEvent) -> None:
        print(
            f"on_retry: {event.tool} attempt {event.attempt} failed ({event.failure},"
            f" {type(event.error).__name__}); next in {event.delay:.2f} s"
        )

    def on_give_up(error: OutcomeUnknown | NotExecuted) -> None:
        print(f"on_give_up: {error.tool} after {error.attempts} attempt(s): {error.reason}")

    policy = RetryPolicy(
        attempt_timeout=0.6,
        wait_initial=0.05,
        wait_max=0.05,
        on_retry=on_retry,
        on_give_up=on_give_up,
    )
    print("--- spans, as they end, and log lines")
    async with (
        serving(build_server()) as url,
        Client(streamable_http_transport(url)) as client,
    ):
        session = RetryingSession(client, policy=policy)
        with trace.get_tracer("shop.checkout").start_as_current_span("checkout"):
            _, report = await session.call_tool_with_report(
                "charge", {"order_id": ORDER, "cents": CENTS}, idempotency_key=KEY
            )
    attempts = len(report.attempts)
    print(f"--- the call: {report.outcome}, {attempts} attempts, replayed={report.replayed}")
    if exposition is not None:
        print("--- metrics, Prometheus exposition (what a scrape of /metrics returns)")
        for line in exposition().decode().splitlines():
            if line.startswith(("mcp", "# TYPE mcp")):
                print(line)
    print("--- metrics, console exporter")
    meter_provider.shutdown()  # the periodic reader exports once more, and last, at shutdown
    print("--- span tree")
    for line in tree(spans.get_finished_spans()):
        print(line)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0]).parse_args()  # --help
    anyio.run(main)
