"""An HTTP upstream that is down when a call comes (SIGKILLed while idle): the proxy's POST is
refused, so nothing ran upstream, and rule 18 says "never sent": the claim released, the call
re-sent within the link's deadline, else -32013 for the caller to retry later; when the upstream
is back on its port, the same key runs once. The ledger server counts what reached it. The same
holds for the continuation of a guarded call's input-required round (the conformance fixture).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import MCPError
from proxy_kit import FIXTURE, InProcess, NodeServers, lines, meta_key, status, text

from idempotency import open_store, wire
from mcp_once.proxy import Upstream, build_proxy
from mcp_once.scenarios import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


async def keys_show(url: str, server: str, key: str) -> dict[str, Any] | None:
    """The record of `key` (tool `charge`) as `mcp-once keys show --json` prints it; None when
    the command finds no live record."""
    record = ["--client-key", key, "--tool", "charge", "--server", server]
    command = [sys.executable, "-m", "mcp_once", "keys", "show", *record, "--json", "--store", url]
    with anyio.fail_after(120):
        done = await anyio.run_process(command, check=False)
    if done.returncode != 0:
        assert "no live record" in done.stderr.decode(), done.stderr.decode()
        return None
    shown: dict[str, Any] = json.loads(done.stdout)
    return shown


async def test_an_http_upstream_down_before_the_write_is_released_then_runs_once(
    node_servers: NodeServers, tmp_path: Path
) -> None:
    """Killed while idle: the call is refused through the link's re-sends, -32013 with
    `data.upstream` "unreachable", no record left (`keys show` finds none), nothing reached the
    upstream; the same key once it is back: executed, one effect."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    upstream = ServerProcess(
        lambda port: node_servers.ledger(ledger, "--port", str(port)),
        log=tmp_path / "upstream.log",
    )
    url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    await anyio.to_thread.run_sync(upstream.start)
    try:
        proxy = build_proxy(Upstream.http(upstream.url), open_store(url))
        async with proxy.opened(), InProcess(proxy) as client:
            await anyio.to_thread.run_sync(upstream.kill)
            with pytest.raises(MCPError) as caught:
                await client.call_tool("charge", {"amount": 4}, meta=meta_key("while-down"))
            assert caught.value.code == wire.STORE_UNAVAILABLE, caught.value
            assert caught.value.data["upstream"] == "unreachable"
            assert lines(ledger / "calls") == 0
            assert await keys_show(url, proxy.name, "while-down") is None
            await anyio.to_thread.run_sync(upstream.start)
            result = await client.call_tool("charge", {"amount": 4}, meta=meta_key("while-down"))
            assert status(result) == "executed" and text(result) == "charged 4 (#1)"
    finally:
        upstream.kill()
    assert lines(ledger / "calls") == 1 and lines(ledger / "effects") == 1


async def test_a_guarded_rounds_continuation_to_a_downed_upstream_is_released_then_runs_once(
    tmp_path: Path,
) -> None:
    """A 2026-07-28 caller's keyed round to a guarded tool (the conformance fixture's
    elicitation tool), the upstream SIGKILLed between the question and the answer: the
    continuation never reached it (refused), so -32013 "unreachable" and nothing stored; once it
    is back, the same continuation runs and is stored, and the same key is then a replay."""
    import mcp_types
    from fastmcp import Client as FastMCPClient
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    tool = "test_input_required_result_elicitation"
    answer: mcp_types.InputResponses = {
        "user_name": mcp_types.ElicitResult(action="accept", content={"name": "Ann"})
    }
    upstream = ServerProcess(
        lambda port: [sys.executable, str(FIXTURE), "--port", str(port), "--unguarded"],
        log=tmp_path / "upstream.log",
    )
    store = open_store(f"sqlite:///{tmp_path / 'keys.sqlite3'}")
    await anyio.to_thread.run_sync(upstream.start)
    try:
        proxy = build_proxy(Upstream.http(upstream.url), store)
        async with proxy.opened(), FastMCPClient(proxy) as client:
            assert client.protocol_version in MODERN_PROTOCOL_VERSIONS
            session, key = client.session, meta_key("round-down")
            question = await session.call_tool(tool, {}, meta=key, allow_input_required=True)
            assert isinstance(question, mcp_types.InputRequiredResult)
            assert await store.list_records() == []  # the question released the claim
            await anyio.to_thread.run_sync(upstream.kill)
            with pytest.raises(MCPError) as caught:
                await session.call_tool(
                    tool, {}, meta=key, input_responses=answer, allow_input_required=True
                )
            assert caught.value.code == wire.STORE_UNAVAILABLE, caught.value
            assert caught.value.data["upstream"] == "unreachable"
            assert await store.list_records() == []
            await anyio.to_thread.run_sync(upstream.start)
            final = await session.call_tool(
                tool, {}, meta=key, input_responses=answer, allow_input_required=True
            )
            again = await session.call_tool(tool, {}, meta=key)
            assert isinstance(final, mcp_types.CallToolResult)
            assert (text(final), status(final)) == ("Hello, Ann!", "executed")
            assert (text(again), status(again)) == ("Hello, Ann!", "replayed")
            (record,) = await store.list_records()
            assert record.tool == tool
    finally:
        upstream.kill()
        await store.aclose()


async def test_the_ledger_upstream_outlives_a_client_that_dies_mid_request(
    node_servers: NodeServers, tmp_path: Path
) -> None:
    """What the fleet test (`test_proxy_fleet.py`) relies on when it SIGKILLs a replica: the
    HTTP ledger server stays up when a client's connection closes halfway through a request's
    body (node rejects the body's read with "aborted"; unhandled, it ended the process, and the
    restarted replica found its upstream gone)."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    log = tmp_path / "upstream.log"
    upstream = ServerProcess(lambda port: node_servers.ledger(ledger, "--port", str(port)), log=log)
    await anyio.to_thread.run_sync(upstream.start)
    try:
        head = (
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            'Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{"json'
        )
        async with await anyio.connect_tcp("127.0.0.1", upstream.port) as half:
            await half.send(head.encode())
        assert upstream.proc is not None
        with anyio.fail_after(30):
            while "request body not read: aborted" not in log.read_text():
                assert upstream.proc.poll() is None, f"the upstream died: {log.read_text()}"
                await anyio.sleep(0.01)  # the server's own log line is the only signal
        proxy = build_proxy(Upstream.http(upstream.url), open_store("memory://"))
        async with proxy.opened(), InProcess(proxy) as client:
            result = await client.call_tool("charge", {"amount": 1}, meta=meta_key("after"))
            assert status(result) == "executed" and text(result) == "charged 1 (#1)"
        assert upstream.proc.poll() is None
    finally:
        upstream.kill()
