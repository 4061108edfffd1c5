"""The client's span per logical call, its child per attempt, and the hooks `on_retry` and
`on_give_up`: real sessions (in memory, over a link that loses answers), a real OpenTelemetry
SDK."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from _faults import Faults, faulty_transport
from _servers import Recorder, make_server
from log_lines import logged
from mcp import Client
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from otel_spans import recorder

from orchestrator import (
    KeyRequest,
    NotExecuted,
    OutcomeUnknown,
    RetryEvent,
    RetryingSession,
    RetryPolicy,
)

KEY = "key-PRIVATE-5150"
SECRET_ARGUMENT = 987654321


def ours(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


def parent_of(span: ReadableSpan, spans: tuple[ReadableSpan, ...]) -> str | None:
    assert span.parent is not None
    (parent,) = [s for s in spans if s.context.span_id == span.parent.span_id]
    return parent.name


def everything_recorded(spans: tuple[ReadableSpan, ...]) -> str:
    """Every name, attribute value and event of the spans, as one text to search."""
    parts: list[str] = []
    for span in spans:
        parts.append(span.name)
        parts.extend(f"{k}={v}" for k, v in (span.attributes or {}).items())
        for event in span.events:
            parts.extend(f"{k}={v}" for k, v in (event.attributes or {}).items())
        parts.append(span.status.description or "")
    return "\n".join(parts)


def session_over(faults: Faults, recorder_: Recorder, **policy: Any) -> RetryingSession:
    server = make_server(recorder_)
    return RetryingSession(
        connect=lambda: Client(faulty_transport(server, faults)),
        policy=RetryPolicy(attempt_timeout=0.2, **policy),
    )


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_retried_call_is_one_span_with_a_child_per_attempt_under_the_callers() -> None:
    spans = recorder()
    faults = Faults(plan={"idem": ["drop"]})  # the first answer is lost: maybe executed
    async with session_over(faults, Recorder()) as rs:
        with trace.get_tracer("test").start_as_current_span("the caller"):
            await rs.call_tool("idem", {"x": SECRET_ARGUMENT}, idempotency_key=KEY)
    recorded = spans.get_finished_spans()
    named = ours(recorded)
    (call,) = named["mcp-once call idem"]
    assert parent_of(call, recorded) == "the caller"
    assert dict(call.attributes or {}) == {
        "gen_ai.tool.name": "idem",
        "mcp.method.name": "tools/call",
        "mcp_once.key_source": "caller",
        "mcp_once.outcome": "result",
        "mcp_once.attempts": 2,
        "mcp_once.replayed": False,
    }
    assert call.status.status_code is trace.StatusCode.UNSET
    first, second = sorted(named["mcp-once attempt idem"], key=lambda s: s.start_time or 0)
    assert [parent_of(s, recorded) for s in (first, second)] == [call.name, call.name]
    assert (first.attributes or {})["mcp_once.attempt"] == 1
    assert (first.attributes or {})["mcp_once.failure"] == "maybe_executed"
    assert first.status.status_code is trace.StatusCode.ERROR
    assert "error.type" in (first.attributes or {})
    assert (second.attributes or {})["mcp_once.attempt"] == 2
    assert "error.type" not in (second.attributes or {})
    # The SDK's request span of each attempt nests under that attempt.
    sends = named["MCP send tools/call idem"]
    assert sorted(parent_of(s, recorded) or "" for s in sends) == [first.name, second.name]
    text = everything_recorded(recorded)
    assert KEY not in text and str(SECRET_ARGUMENT) not in text


@pytest.mark.parametrize(
    ("how", "kind"), [("minted", "minted"), ("key_source", "key_source"), ("caller", "caller")]
)
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_call_span_names_where_the_key_came_from_never_the_key(
    how: str, kind: str
) -> None:
    spans = recorder()
    server = make_server(Recorder())

    def source(request: KeyRequest) -> str:
        return KEY

    async with (
        Client(server) as client,
        RetryingSession(client, key_source=source if how == "key_source" else None) as rs,
    ):
        await rs.call_tool("idem", {"x": 1}, idempotency_key=KEY if how == "caller" else None)
    (call,) = ours(spans.get_finished_spans())["mcp-once call idem"]
    assert (call.attributes or {})["mcp_once.key_source"] == kind
    assert KEY not in everything_recorded(spans.get_finished_spans())


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_call_that_gives_up_says_so_on_its_span_and_to_on_give_up() -> None:
    spans = recorder()
    given_up: list[OutcomeUnknown | NotExecuted] = []
    faults = Faults(plan={"plain": ["drop"]})  # not idempotent: no retry after a lost answer
    async with session_over(faults, Recorder(), on_give_up=given_up.append) as rs:
        with pytest.raises(OutcomeUnknown) as caught:
            await rs.call_tool("plain", {"x": SECRET_ARGUMENT}, idempotency_key=KEY)
    assert given_up == [caught.value]  # the very exception the caller gets, key and all
    assert given_up[0].key == KEY and given_up[0].reason == "not_idempotent"
    (call,) = ours(spans.get_finished_spans())["mcp-once call plain"]
    attributes = dict(call.attributes or {})
    assert attributes["mcp_once.outcome"] == "outcome_unknown"
    assert attributes["mcp_once.give_up_reason"] == "not_idempotent"
    assert attributes["error.type"] == "OutcomeUnknown"
    assert call.status.status_code is trace.StatusCode.ERROR


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_on_retry_hears_each_retry_before_its_wait() -> None:
    heard: list[RetryEvent] = []
    recorder_ = Recorder()
    faults = Faults(plan={"idem": ["drop", "drop"]})
    async with session_over(faults, recorder_, on_retry=heard.append) as rs:
        await rs.call_tool("idem", {"x": 1})
    assert [(e.tool, e.attempt, e.failure) for e in heard] == [
        ("idem", 1, "maybe_executed"),
        ("idem", 2, "maybe_executed"),
    ]
    assert all(e.delay >= 0 and isinstance(e.error, Exception) for e in heard)
    assert recorder_.attempts("idem") == [1, 2, 3]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_hook_that_raises_breaks_nothing_and_is_logged_by_type_only() -> None:
    def boom(event: object) -> None:
        raise RuntimeError(f"hook failed on {KEY}")

    faults = Faults(plan={"idem": ["drop"], "plain": ["drop"]})
    with logged("orchestrator") as lines:
        async with session_over(faults, Recorder(), on_retry=boom, on_give_up=boom) as rs:
            result = await rs.call_tool("idem", {"x": 1}, idempotency_key=KEY)
            with pytest.raises(OutcomeUnknown):  # not the hook's RuntimeError
                await rs.call_tool("plain", {"x": 1})
    assert not result.is_error
    warnings = [line[2] for line in lines.lines if line[1] == logging.WARNING]
    assert "the on_retry hook raised RuntimeError; ignored" in warnings
    assert "the on_give_up hook raised RuntimeError; ignored" in warnings
    assert not any(KEY in line[2] or KEY in line[3] for line in lines.lines)


def test_hooks_are_checked_where_the_policy_is_made() -> None:
    async def slow(event: RetryEvent) -> None: ...

    with pytest.raises(TypeError, match="on_retry must be a plain function"):
        RetryPolicy(on_retry=slow)
    with pytest.raises(TypeError, match="on_give_up must be a callable"):
        RetryPolicy(on_give_up="print")  # type: ignore[arg-type]
