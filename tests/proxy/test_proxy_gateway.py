"""Several upstreams behind one proxy (`build_gateway`, `mcp-once proxy --config FILE`), real
upstreams as stdio children and HTTP processes (the slow tier).

What one front in front of several upstreams must keep: each tool named `<server>_<tool>` as
FastMCP's multi-server proxy names it (prompts and resources too, and completion routed to the
upstream whose prompt or template it names); each upstream its own records (the same client key
on two upstreams runs each once, its record under that upstream's server name and its own tool
name), its own policy section (`[servers."<name>".tools."<tool>"]` over the plain tables); the
guard's errors with their codes (-32012 for a call the upstream may have run); and one upstream
down never stops the others: its tools answer -32013 (not run, retry later), listed as last
listed, and it is back at its next call with no restart, while an entry that cannot be started
at all leaves the front serving the rest (every entry failing stops it, exit 2). The effects are
counted in each ledger server's own files.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client
from mcp import MCPError
from mcp_types import PromptReference, ResourceTemplateReference
from proxy_kit import NodeServers, lines, meta_key, proxy_command, status, text
from test_proxy_http_upstream import keys_show

from idempotency import open_store, wire
from mcp_once.proxy import OnceGateway, Upstream, build_gateway, parse_policy
from mcp_once.scenarios import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

KEY = "the-same-client-key"


def unreachable(error: MCPError) -> bool:
    return error.code == wire.STORE_UNAVAILABLE and error.error.data["upstream"] == "unreachable"


def ledger_upstream(node_servers: NodeServers, folder: Path, name: str) -> Upstream:
    folder.mkdir()
    return Upstream.stdio(*node_servers.ledger(folder), name=name)


@asynccontextmanager
async def front(gateway: OnceGateway) -> AsyncIterator[Client[Any]]:
    async with gateway.opened(), Client(gateway) as client:
        yield client


async def test_each_upstream_is_named_scoped_and_served_on_one_front(
    node_servers: NodeServers, tmp_path: Path
) -> None:
    """Two ledger servers (two ledgers) and `server-everything` on one store: tools, prompts and
    resources prefixed as FastMCP's multi-server proxy prefixes them; the same key on `a_charge`
    and `b_charge` runs each once (each ledger one effect), each repeat replayed; each record
    under its upstream's own server name and tool name, as a single proxy of it keeps it."""
    url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    a = ledger_upstream(node_servers, tmp_path / "a", "a")
    b = ledger_upstream(node_servers, tmp_path / "b", "b")
    everything = Upstream.stdio(*node_servers.reference("server-everything"), name="everything")
    gateway = build_gateway([a, b, everything], open_store(url))
    async with front(gateway) as client:
        names = {tool.name for tool in await client.list_tools()}
        assert {"a_charge", "a_balance", "b_charge", "b_balance", "everything_echo"} <= names
        assert all(n.startswith(("a_", "b_", "everything_")) for n in names), names
        for tool in ("a_charge", "b_charge"):
            for expected in ("executed", "replayed"):
                result = await client.call_tool_mcp(tool, {"amount": 5}, meta=meta_key(KEY))
                assert status(result) == expected and text(result) == "charged 5 (#1)"
        # Prompts and resources of `everything`, prefixed; completion goes to it.
        prompts = {p.name for p in await client.list_prompts()}
        assert "everything_completable-prompt" in prompts, prompts
        resources = [str(r.uri) for r in await client.list_resources()]
        assert resources and all(u.startswith("demo://everything/") for u in resources)
        read = await client.read_resource(resources[0])
        assert read and getattr(read[0], "text", "")
        templates = [t.uri_template for t in await client.list_resource_templates()]
        completed = await client.complete(
            ResourceTemplateReference(uri=templates[0]), {"name": "resourceId", "value": "1"}
        )
        assert completed.values == ["1"]
        completed = await client.complete(
            PromptReference(name="everything_completable-prompt"),
            {"name": "department", "value": "E"},
        )
        assert completed.values == ["Engineering"]
    for folder in ("a", "b"):
        assert lines(tmp_path / folder / "effects") == 1, folder
    for upstream in (a, b):
        record = await keys_show(url, upstream.identity.server, KEY)
        assert record is not None and record["state"] == "completed", upstream.name
    assert await keys_show(url, "mcp-once proxy: a", KEY) is None  # no front-wide scope


async def test_each_upstream_has_its_own_policy_section(
    node_servers: NodeServers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`[tools."charge"]` applies to both ledgers; `[servers."b".tools."charge"]` has the last
    word for `b` only: there `charge` passes through unguarded (a repeat runs again), on `a` it
    is guarded and needs a key. Typos are reported once: a plain pattern no upstream has, a
    section's pattern its upstream does not have, a section naming no upstream."""
    policy = parse_policy(
        {
            "tools": {"charge": {"keys": "required"}, "chrage": {"guard": True}},
            "servers": {
                "b": {"tools": {"charge": {"guard": False}, "balanse": {"guard": True}}},
                "c": {"tools": {"charge": {"guard": False}}},
            },
        }
    )
    a = ledger_upstream(node_servers, tmp_path / "a", "a")
    b = ledger_upstream(node_servers, tmp_path / "b", "b")
    gateway = build_gateway([a, b], open_store("memory://"), policy=policy)
    async with front(gateway) as client:
        listed = {t.name: t for t in await client.list_tools()}
        assert wire.PROXY_META in (listed["a_charge"].meta or {})
        assert wire.PROXY_META not in (listed["b_charge"].meta or {})
        with pytest.raises(MCPError) as keyless:
            await client.call_tool_mcp("a_charge", {"amount": 1})
        assert keyless.value.code == -32602, keyless.value
        for _ in range(2):
            guarded = await client.call_tool_mcp("a_charge", {"amount": 1}, meta=meta_key(KEY))
            passed = await client.call_tool_mcp("b_charge", {"amount": 1}, meta=meta_key(KEY))
            assert status(guarded) in ("executed", "replayed") and status(passed) is None
    assert lines(tmp_path / "a" / "effects") == 1
    assert lines(tmp_path / "b" / "effects") == 2
    said = [r.getMessage() for r in caplog.records if r.name == "mcp_once.proxy"]
    # Each with the nearest tool name: of any upstream for a plain table, of its own for a
    # section's (issue 43 item 9).
    plain = "policy pattern 'chrage' matches no tool of any upstream; did you mean 'charge'?"
    assert said.count(plain) == 1, said
    own = "policy pattern 'servers.\"b\".tools.\"balanse\"' matches no tool of 'b'"
    assert said.count(f"{own}; did you mean 'balance'?") == 1, said
    assert any("[servers.'c'] names no upstream of this proxy" in m for m in said), said
    assert not any("'charge' matches no tool" in m for m in said), said


async def test_one_upstream_down_answers_not_run_and_never_stops_the_others(
    node_servers: NodeServers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry whose command does not exist, an HTTP ledger killed and started again, a stdio
    ledger killed mid-call after its effect: the front starts and serves the others; the missing
    one's calls answer -32013; the HTTP one, down, is listed as last listed and its calls answer
    -32013 with nothing stored, then run once when it is back (no restart of the front); the
    stdio one's interrupted call answers -32012 (and again to a repeat), and its next call starts
    a new child. Meanwhile the other upstream's calls all run."""
    http_ledger = tmp_path / "http"
    http_ledger.mkdir()
    remote = ServerProcess(
        lambda port: node_servers.ledger(http_ledger, "--port", str(port)),
        log=tmp_path / "http.log",
    )
    await anyio.to_thread.run_sync(remote.start)
    local = ledger_upstream(node_servers, tmp_path / "local", "local")
    upstreams = [
        Upstream.http(remote.url, name="remote"),
        local,
        Upstream.stdio("no-such-command-mcp-once-test", name="missing"),
    ]
    gateway = build_gateway(upstreams, open_store("memory://"))
    n = 0

    async def local_runs(client: Client[Any]) -> None:
        nonlocal n
        n += 1
        result = await client.call_tool_mcp("local_charge", {"amount": n}, meta=meta_key(f"l{n}"))
        assert status(result) == "executed", result

    try:
        async with front(gateway) as client:
            assert "'no-such-command-mcp-once-test' could not be started" in caplog.text
            names = {t.name for t in await client.list_tools()}
            assert "remote_charge" in names and "local_charge" in names
            assert not any(name.startswith("missing_") for name in names)
            with pytest.raises(MCPError) as missing:
                await client.call_tool_mcp("missing_charge", {"amount": 1}, meta=meta_key(KEY))
            assert unreachable(missing.value), missing.value
            await local_runs(client)

            await anyio.to_thread.run_sync(remote.kill)
            with pytest.raises(MCPError) as down:
                await client.call_tool_mcp("remote_charge", {"amount": 7}, meta=meta_key(KEY))
            assert unreachable(down.value), down.value
            assert "remote_charge" in {t.name for t in await client.list_tools()}
            await local_runs(client)
            await anyio.to_thread.run_sync(remote.start)
            back = await client.call_tool_mcp("remote_charge", {"amount": 7}, meta=meta_key(KEY))
            assert status(back) == "executed" and text(back) == "charged 7 (#1)"

            crash = {"amount": 9, "crash": "after"}
            for _ in range(2):
                with pytest.raises(MCPError) as lost:
                    await client.call_tool_mcp("local_charge", crash, meta=meta_key("crash"))
                assert lost.value.code == wire.OUTCOME_UNKNOWN, lost.value
            await local_runs(client)
            again = await client.call_tool_mcp("remote_charge", {"amount": 7}, meta=meta_key(KEY))
            assert status(again) == "replayed"
    finally:
        remote.kill()
    assert lines(http_ledger / "effects") == 1
    # The three workload calls and the one the kill cut short, each once.
    assert lines(tmp_path / "local" / "effects") == 4


async def test_every_entry_failing_to_start_stops_the_front(tmp_path: Path) -> None:
    """Nothing to serve: exit 2, one line per entry, no traceback (as a single proxy)."""
    config = tmp_path / "config.json"
    servers = {name: {"command": f"no-such-command-{name}"} for name in ("one", "two")}
    config.write_text(json.dumps({"mcpServers": servers}))
    command = proxy_command("--store", "memory://", "--config", str(config))
    with anyio.fail_after(120):
        done = await anyio.run_process(command, check=False, stdin=subprocess.DEVNULL)
    said = done.stderr.decode()
    assert done.returncode == 2, said
    for name in ("one", "two"):
        assert f"the upstream command 'no-such-command-{name}' could not be started" in said
    assert "Traceback" not in said, said
