"""Pure parts: keys, Retry-After parsing, failure classification, the gate."""

from __future__ import annotations

import email.utils
import time

import pytest
from mcp import MCPError
from mcp_types import Tool, ToolAnnotations

from idempotency import wire
from orchestrator import mint_key, session_gone
from orchestrator._classify import classify
from orchestrator._gate import retry_gate
from orchestrator._http import AttemptProbe, parse_retry_after
from orchestrator._key import resolve_key


def test_minted_keys_are_valid_and_unique() -> None:
    keys = {mint_key() for _ in range(1000)}
    assert len(keys) == 1000
    assert all(wire.key_problem(key) is None for key in keys)


def test_resolve_key() -> None:
    assert resolve_key("mine", None) == "mine"
    assert resolve_key(None, {wire.KEY_META: "meta"}) == "meta"
    assert resolve_key("same", {wire.KEY_META: "same"}) == "same"
    assert wire.key_problem(resolve_key(None, {"other": 1})) is None
    for bad in ("", "x" * 256, "naïve", 7):
        with pytest.raises(ValueError):
            resolve_key(bad, None)
    with pytest.raises(ValueError):
        resolve_key("a", {wire.KEY_META: "b"})


def test_parse_retry_after() -> None:
    now = time.time()
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("-5") is None
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert 29 <= (parse_retry_after(date, now=now) or 0) <= 30
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after(past, now=now) == 0.0


def _probe(**fields: object) -> AttemptProbe:
    probe = AttemptProbe("k", 1)
    for name, value in fields.items():
        setattr(probe, name, value)
    return probe


@pytest.mark.parametrize(
    ("error", "probe", "closed", "kind", "dead"),
    [
        (MCPError(-32001, "Request 'tools/call' timed out"), None, False, "maybe_executed", False),
        (MCPError(-32000, "Connection closed"), None, False, "maybe_executed", True),
        (
            MCPError(-32000, "SSE stream ended without a response"),
            None,
            False,
            "maybe_executed",
            False,
        ),
        (
            MCPError(-32000, "SSE stream ended without a response"),
            None,
            True,
            "maybe_executed",
            True,
        ),
        (
            MCPError(-32603, "Server returned an error response"),
            None,
            False,
            "maybe_executed",
            False,
        ),
        (
            MCPError(-32603, "Server returned an error response"),
            _probe(status=502, sent=True),
            False,
            "maybe_executed",
            False,
        ),
        (
            MCPError(-32603, "Server returned an error response"),
            _probe(status=503, sent=False),
            False,
            "never_sent",
            False,
        ),
        (
            MCPError(-32603, "Server returned an error response"),
            _probe(status=403, sent=True),
            False,
            "permanent",
            False,
        ),
        (MCPError(-32603, "internal", {"why": "bug"}), None, False, "permanent", False),
        (MCPError(-32600, "Session terminated"), None, False, "never_sent", True),
        (MCPError(-32600, "Session not found"), None, False, "never_sent", True),
        (MCPError(-32001, "Session not found"), None, False, "never_sent", True),
        (
            MCPError(-32600, "odd", {"x": 1}),
            _probe(status=404, sent=True),
            False,
            "never_sent",
            True,
        ),
        (MCPError(-32601, "Not Found"), _probe(status=404, sent=True), False, "permanent", False),
        (MCPError(-32600, "Invalid request"), None, False, "permanent", False),
        (
            MCPError(wire.IN_PROGRESS, "busy", {"retryAfterMs": 1500}),
            None,
            False,
            "in_progress",
            False,
        ),
        (MCPError(wire.STORE_UNAVAILABLE, "down"), None, False, "store_unavailable", False),
        (MCPError(wire.KEY_REUSED, "reused"), None, False, "permanent", False),
        (MCPError(wire.OUTCOME_UNKNOWN, "unknown"), None, False, "permanent", False),
        (TimeoutError("write"), None, False, "maybe_executed", False),
        (RuntimeError("bad schema"), None, False, "permanent", False),
    ],
)
def test_classify(
    error: Exception, probe: AttemptProbe | None, closed: bool, kind: str, dead: bool
) -> None:
    failure = classify(error, probe, session_closed=closed)
    assert (failure.kind, failure.session_dead) == (kind, dead)


@pytest.mark.parametrize(
    ("error", "gone"),
    [
        (MCPError(-32600, "Session terminated"), True),  # the SDK client's own, on a 404
        (MCPError(-32600, "Session not found"), True),  # a Python SDK server's body
        (MCPError(-32001, "Session not found"), True),  # a TypeScript SDK server's body
        (MCPError(-32600, "Invalid request"), False),
        (MCPError(-32000, "Connection closed"), False),  # may have run: not a refusal
        (MCPError(-32603, "Server returned an error response"), False),
        (RuntimeError("Session not found"), False),
    ],
)
def test_session_gone_is_a_refusal_before_dispatch(error: Exception, gone: bool) -> None:
    """What a proxy's raw forward may send again on a new session (nothing ran)."""
    assert session_gone(error) is gone


def test_classify_reads_hints() -> None:
    busy = classify(
        MCPError(wire.IN_PROGRESS, "busy", {"retryAfterMs": 1500}), None, session_closed=False
    )
    assert busy.retry_after == 1.5
    odd = classify(
        MCPError(wire.IN_PROGRESS, "busy", {"retryAfterMs": "soon"}), None, session_closed=False
    )
    assert odd.retry_after is None
    http = classify(
        MCPError(-32603, "Server returned an error response"),
        _probe(status=429, sent=True, retry_after=4.0),
        session_closed=False,
    )
    assert (http.http_status, http.retry_after) == (429, 4.0)


def _tool(
    idempotent_hint: bool | None = None,
    read_only_hint: bool | None = None,
    keys: object = None,
) -> Tool:
    hints = ToolAnnotations(idempotent_hint=idempotent_hint, read_only_hint=read_only_hint)
    meta = None if keys is None else {wire.IDEMPOTENCY_META: {"keys": keys}}
    return Tool(name="t", input_schema={"type": "object"}, annotations=hints, meta=meta)


@pytest.mark.parametrize(
    ("kind", "tool", "overrides", "trust", "open_"),
    [
        ("never_sent", None, {}, True, True),
        ("never_sent", None, {"t": "never"}, False, True),
        ("permanent", _tool(idempotent_hint=True), {"t": "idempotent"}, True, False),
        ("maybe_executed", _tool(idempotent_hint=True), {}, True, True),
        ("maybe_executed", _tool(read_only_hint=True), {}, True, True),
        ("maybe_executed", _tool(idempotent_hint=False), {}, True, False),
        ("maybe_executed", _tool(), {}, True, False),
        # A guarded server lists the author's annotations to a caller whose keyless calls it
        # cannot deduplicate; its `_meta` entry still promises a record for every keyed call.
        ("maybe_executed", _tool(idempotent_hint=False, keys="optional"), {}, True, True),
        ("maybe_executed", _tool(keys="required"), {}, True, True),
        ("maybe_executed", _tool(keys="sometimes"), {}, True, False),
        ("maybe_executed", _tool(keys="optional"), {}, False, False),
        ("maybe_executed", None, {}, True, False),
        ("maybe_executed", _tool(idempotent_hint=True), {}, False, False),
        ("maybe_executed", None, {"t": "idempotent"}, False, True),
        ("in_progress", _tool(idempotent_hint=True), {"t": "never"}, True, False),
        ("store_unavailable", _tool(read_only_hint=True), {}, True, True),
    ],
)
def test_gate(
    kind: str, tool: Tool | None, overrides: dict[str, str], trust: bool, open_: bool
) -> None:
    decision = retry_gate(
        kind,  # type: ignore[arg-type]
        tool_name="t",
        tool=tool,
        overrides=overrides,  # type: ignore[arg-type]
        trust_annotations=trust,
        key_attached=True,
    )
    assert decision.open is open_


def test_gate_needs_a_key() -> None:
    decision = retry_gate(
        "maybe_executed",
        tool_name="t",
        tool=_tool(idempotent_hint=True),
        overrides={},
        trust_annotations=True,
        key_attached=False,
    )
    assert not decision.open
