"""Audit entries as OpenTelemetry log records, with the same fields, for a SIEM (issue 37).

The events are written by the stores (on Redis, by Lua scripts the process never sees run), so
they are exported where they are read: `mcp-once audit --follow --otel` under an OpenTelemetry
logs pipeline (`opentelemetry-instrument`, or any configured `LoggerProvider`) turns the stream
into log records as it arrives. Without a configured provider the API's no-op logger drops them.

Attributes are the fields of `audit --json`, under `mcp_once.*` (the entry's id as
`mcp_once.audit.id`, the record by its store key, a digest; the tool by `gen_ai.tool.name`, as the
guard's spans do; when the line was written as the log record's timestamp): never an argument, a
result or a raw key, as in the stream itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry._logs import Logger, LogRecord, SeverityNumber, get_logger

from .history import AuditEntry

_logger = get_logger("mcp-once.audit")


def attributes(found: AuditEntry, server: str | None = None) -> dict[str, str | int | float]:
    """The log record's attributes for one audit entry; `server`: its record's server, as the
    record's history names it (`audit --json`'s `server`)."""
    event = found.event
    fields: dict[str, str | int | float] = {
        "mcp_once.audit.id": found.id,
        "mcp_once.record": found.key,
        "mcp_once.event": event.kind,
        "mcp_once.fence": event.fence,
        "mcp_once.attempt": event.attempt,
        "mcp_once.digest": event.digest,
    }
    if event.prev:  # the chain, as `audit --json` gives it: a SIEM can check it on its side
        fields["mcp_once.prev"] = event.prev
    if found.tool:
        fields["gen_ai.tool.name"] = found.tool
    if event.written != event.at:  # an updated count: the record is the update's, `at` the first
        fields["mcp_once.at"] = event.at
    fields.update({f"mcp_once.{name}": value for name, value in event.details.items()})
    if server is not None:
        fields["mcp_once.server"] = server
    return fields


def export(
    entries: Iterable[AuditEntry],
    logger: Logger | None = None,
    servers: Mapping[str, str | None] | None = None,
) -> int:
    """Emit one log record per entry, timed when its line was written (a replay or refusal
    counted again is an update `audit --follow` reads as it arrives: its log record is the
    update's, at `last_at`, with the event's first time as `mcp_once.at`); returns how many.
    `servers`: the server of each record (by store key), as `mcp_once.server`."""
    target = logger or _logger
    count = 0
    for found in entries:
        target.emit(
            LogRecord(
                timestamp=round(found.event.written * 1e9),
                severity_number=SeverityNumber.INFO,
                severity_text="INFO",
                body=f"{found.event.kind}: record {found.key}",
                attributes=attributes(found, (servers or {}).get(found.key)),
            )
        )
        count += 1
    return count
