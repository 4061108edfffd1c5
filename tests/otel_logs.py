"""Log records as a real OpenTelemetry SDK records them: one in-memory exporter per test process.

The global logger provider can be set once per process; every logger handed out before (the
audit exporter's: an API proxy) follows it. `log_recorder()` clears what earlier tests left.
"""

from __future__ import annotations

from opentelemetry._logs import set_logger_provider
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

_exporter: list[InMemoryLogRecordExporter] = []


def log_recorder() -> InMemoryLogRecordExporter:
    """The process's log record exporter, emptied."""
    if not _exporter:
        provider = LoggerProvider()
        exporter = InMemoryLogRecordExporter()
        provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
        set_logger_provider(provider)
        _exporter.append(exporter)
    _exporter[0].clear()
    return _exporter[0]
