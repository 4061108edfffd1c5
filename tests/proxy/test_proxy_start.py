"""`mcp-once proxy` starting while its upstream is away, as real processes.

An HTTP upstream not reachable yet (a fleet restarting, a deploy, compose starting services in any
order) is no reason not to serve: the proxy starts, a call is answered "never sent" (-32013,
`data.upstream` "unreachable", nothing stored) and so is a listing, and once the upstream listens
on its port the next call runs, once (the upstream's ledger counts it), with no restart; the
policy's unmatched-pattern report is made at that first successful listing. A stdio command that
cannot be started at all is bad input: the proxy exits at once, naming it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest
from fastmcp import Client
from mcp import MCPError
from proxy_kit import NodeServers, lines, meta_key, proxy_command, status, text
from test_proxy_http_upstream import keys_show

from idempotency import wire
from mcp_once.proxy import Upstream
from mcp_once.scenarios import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


def unreachable(error: MCPError) -> bool:
    return error.code == wire.STORE_UNAVAILABLE and error.error.data["upstream"] == "unreachable"


async def test_a_proxy_started_before_its_http_upstream_serves_and_runs_the_call_once_it_is_up(
    node_servers: NodeServers, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    # Its port is chosen now; nothing listens on it until `upstream.start()`.
    upstream = ServerProcess(
        lambda port: node_servers.ledger(ledger, "--port", str(port)),
        log=tmp_path / "upstream.log",
    )
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools."chrage"]\nguard = true\n')  # a typo, reported once listed
    store_file = tmp_path / "keys.sqlite3"
    store = f"sqlite:///{store_file}"
    log = tmp_path / "proxy.log"
    proxy = ServerProcess(
        lambda port: proxy_command(
            "--listen",
            f"127.0.0.1:{port}",
            "--store",
            store,
            "--policy",
            str(policy),
            "--upstream",
            upstream.url,
        ),
        log=log,
    )
    await anyio.to_thread.run_sync(proxy.start)  # waits until the proxy listens
    try:
        async with Client(proxy.url) as client:
            with pytest.raises(MCPError) as listing:
                await client.list_tools_mcp()
            assert unreachable(listing.value), listing.value
            with pytest.raises(MCPError) as call:
                await client.call_tool_mcp("charge", {"amount": 4}, meta=meta_key("early"))
            assert unreachable(call.value), call.value
            assert "matches no tool" not in log.read_text()  # no listing yet: nothing to report
            name = Upstream.http(upstream.url).identity.server
            # Nothing stored: no record (the store's file is made at its first write, if any).
            assert not store_file.exists() or await keys_show(store, name, "early") is None
            assert lines(ledger / "calls") == 0

            await anyio.to_thread.run_sync(upstream.start)
            listed = await client.list_tools_mcp()
            assert "charge" in [tool.name for tool in listed.tools]
            result = await client.call_tool_mcp("charge", {"amount": 4}, meta=meta_key("early"))
            assert status(result) == "executed" and text(result) == "charged 4 (#1)"
            again = await client.call_tool_mcp("charge", {"amount": 4}, meta=meta_key("early"))
            assert status(again) == "replayed" and text(again) == "charged 4 (#1)"
            assert await keys_show(store, name, "early") is not None  # the same record, now
        assert log.read_text().count("policy pattern 'chrage' matches no tool") == 1
    finally:
        upstream.kill()
        proxy.kill()
    assert lines(ledger / "calls") == 1 and lines(ledger / "effects") == 1


async def test_a_stdio_upstream_command_that_does_not_exist_stops_the_proxy_naming_it(
    tmp_path: Path,
) -> None:
    """`mcp-once proxy` exits 2 (bad input) naming the command; `mcp-once tools` exits 3 (the
    upstream cannot be reached) naming it too; neither with a traceback."""
    missing = "no-such-command-mcp-once-test"
    proxy = proxy_command("--store", f"sqlite:///{tmp_path / 'keys.sqlite3'}", "--", missing)
    tools = [*proxy_command()[:-1], "tools", "--", missing]
    for command, code, says in (
        (proxy, 2, f"the upstream command {missing!r} could not be started"),
        (tools, 3, f"cannot reach the upstream {missing}"),
    ):
        with anyio.fail_after(120):
            done = await anyio.run_process(command, check=False, stdin=subprocess.DEVNULL)
        said = done.stderr.decode()
        assert done.returncode == code, said
        assert says in said and "No such file or directory" in said, said
        assert "Traceback" not in said, said
