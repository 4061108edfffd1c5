"""`on_replay`, the server's hook, and the guard's span of a replay: real sessions in memory, a
real OpenTelemetry SDK. The hook hears replays only, never the key, the arguments or the result;
one that raises breaks nothing."""

from __future__ import annotations

import logging

import pytest
from log_lines import logged
from mcp.client import Client
from otel_spans import recorder
from server_kit import Effects, effect_server, marker, meta

from idempotency import MemoryKeyStore, Policy, Replay
from idempotency._guard.policy import make_policy

pytestmark = pytest.mark.anyio

KEY = "key-PRIVATE-0451"
ORDER = "order-SECRET-77"


async def test_on_replay_hears_each_replay_and_nothing_else() -> None:
    heard: list[Replay] = []
    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects, gated=False, on_replay=heard.append)
    args = {"order": ORDER, "cents": 5}
    async with Client(server) as client:
        first = await client.call_tool("charge", args, meta=meta(KEY))
        assert heard == []  # an execution is not a replay
        again = await client.call_tool("charge", args, meta=meta(KEY))
        other = [await client.call_tool("charge", args, meta=meta(f"{KEY}-b")) for _ in "12"]
    assert [marker(r)["status"] for r in (first, again, *other)] == [
        "executed",
        "replayed",
        "executed",
        "replayed",
    ]
    assert effects.count == 2
    assert [(e.tool, e.executions, e.key_source) for e in heard] == [("charge", 1, "client")] * 2
    assert all(0 <= e.age < 60 for e in heard)


async def test_the_guards_span_of_a_replay_names_it_without_the_key_or_the_arguments() -> None:
    spans = recorder()
    server = effect_server(MemoryKeyStore(), Effects(), gated=False)
    async with Client(server) as client:
        for _ in "12":
            await client.call_tool("charge", {"order": ORDER, "cents": 5}, meta=meta(KEY))
    guards = [s for s in spans.get_finished_spans() if s.name == "mcp-once guard charge"]
    assert [
        {k: v for k, v in (s.attributes or {}).items() if k != "mcp_once.record"} for s in guards
    ] == [
        {
            "gen_ai.tool.name": "charge",
            "mcp.method.name": "tools/call",
            "mcp_once.key_source": "client",
            "mcp_once.fence": 1,
            "mcp_once.outcome": "executed",
            "mcp_once.replayed": False,
        },
        {
            "gen_ai.tool.name": "charge",
            "mcp.method.name": "tools/call",
            "mcp_once.key_source": "client",
            "mcp_once.outcome": "replayed",
            "mcp_once.replayed": True,
        },
    ]
    text = repr([dict(s.attributes or {}) for s in spans.get_finished_spans()])
    assert KEY not in text and ORDER not in text


async def test_a_raising_on_replay_hook_breaks_nothing_and_is_logged_by_type_only() -> None:
    def boom(event: Replay) -> None:
        raise RuntimeError(f"the hook saw {KEY}")

    server = effect_server(MemoryKeyStore(), Effects(), gated=False, on_replay=boom)
    with logged("idempotency") as lines:
        async with Client(server) as client:
            for _ in "12":
                last = await client.call_tool(
                    "charge", {"order": ORDER, "cents": 5}, meta=meta(KEY)
                )
    assert marker(last)["status"] == "replayed" and not last.is_error
    assert (logging.WARNING, "the on_replay hook raised RuntimeError; ignored") in [
        (line[1], line[2]) for line in lines.lines
    ]
    assert not any(KEY in line[2] or KEY in line[3] for line in lines.lines)


async def _async_hook(event: Replay) -> None: ...


def test_on_replay_is_checked_where_the_guard_is_configured() -> None:
    with pytest.raises(TypeError, match="on_replay must be a plain function"):
        Policy(on_replay=_async_hook)
    with pytest.raises(TypeError, match="on_replay must be a callable"):
        make_policy({"on_replay": 3})  # type: ignore[typeddict-item]
