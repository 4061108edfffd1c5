"""The operator's path through `mcp-once proxy` after an outcome went unknown (issue 43, items 7
and 8), as real processes (the slow tier): the proxy started as the CLI, its default store and
manifest in a state folder of the test's own, `keys ... --proxy NAME` run as the operator would.

- The upstream child SIGKILLed after its effect: the caller and a repeat get -32012 in words, the
  proxy's stderr has one WARNING line for the death (the record turned UNKNOWN, `in_doubt`, in
  those words) and one for each -32012 answer (`unknown`), no traceback, and `keys settle
  --failed` needs no `--force` (the proxy saw its child exit: nothing of the call can still be
  running).
- A settle whose result the tool's output schema rejects (server-memory's tools all list one):
  refused where the proxy's manifest knows the schema; where it does not, each replay is answered
  with an error saying what to do, and `keys settle --force` corrects the settle.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from mcp import MCPError, StdioServerParameters
from mcp.client import Client
from mcp.client.stdio import stdio_client
from proxy_kit import NodeServers, lines, meta_key, proxy_command, status, text
from test_proxy_identity import state  # noqa: F401  (the fixture)

from idempotency import (
    CallScope,
    SQLiteKeyStore,
    default_scope,
    fingerprint,
    history_saying,
    store_key,
    wire,
)
from mcp_once._cli import main
from mcp_once._cli._proxies import find

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
    pytest.mark.usefixtures("state"),  # a state folder of the test's own, for both sides
]

#: What the proxy says of a stdio upstream that died mid-call, to the caller and the operator.
DIED = "the upstream process exited while the call ran; its effect may have happened"


@asynccontextmanager
async def proxy_process(command: list[str], stderr: Path, **env: str) -> AsyncIterator[Client]:
    """`command` (an `mcp-once proxy`) as a stdio server, its stderr written to `stderr`."""
    params = StdioServerParameters(command=command[0], args=command[1:], env={**os.environ, **env})
    with stderr.open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            yield client


async def operator(*argv: str) -> int:
    """`mcp-once *argv`, as the operator runs it (in-process, in a worker thread)."""
    code: int = await anyio.to_thread.run_sync(main, list(argv))
    return code


async def test_an_upstream_killed_after_its_effect_is_settled_failed_at_once_by_proxy_name(
    node_servers: NodeServers, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    log = tmp_path / "proxy.stderr"
    command = proxy_command("--name", "ledger", "--", *node_servers.ledger(ledger))
    crash = {"amount": 6, "crash": "after-once"}
    async with proxy_process(command, log) as client:
        answers = []
        for _ in range(2):  # the call, then a repeat of it
            with pytest.raises(MCPError) as caught:
                await client.call_tool("charge", crash, meta=meta_key("crashed"))
            answers.append(caught.value)
        assert [a.code for a in answers] == [wire.OUTCOME_UNKNOWN] * 2
        for answer in answers:
            assert DIED in answer.message, answer.message
            assert "renewing" not in answer.message and "not_idempotent" not in answer.message
        assert lines(ledger / "calls") == 1 and lines(ledger / "effects") == 1

        # The effect happened once; the operator decides it is to run again, at once: the
        # proxy saw its child exit, so no paused holder can still charge (no --force).
        settled = await operator(
            "keys", "settle", "--proxy", "ledger", "--client-key", "crashed", "--tool", "charge",
            "--failed", "--reason", "refunded by hand",
        )  # fmt: skip
        assert settled == 0
        rerun = await client.call_tool("charge", crash, meta=meta_key("crashed"))
        assert status(rerun) == "executed" and text(rerun) == "charged 6 (#2)"
    assert lines(ledger / "effects") == 2
    said = log.read_text()
    assert "Traceback" not in said and "╭" not in said, said
    assert "Starting MCP server" not in said, said  # FastMCP's start line
    warnings = [line for line in said.splitlines() if "WARNING" in line]
    # The death, once (rule 25's in_doubt line, in the proxy's words), then each -32012 answer
    # (issue 48's unknown line: the call's and the repeat's); nothing else, no cut_short line.
    assert len(warnings) == 3, said
    named = [
        re.search(r"record ([0-9a-f]{12}) \(tool 'charge', server '[^']+'\): ", w) for w in warnings
    ]
    assert all(named) and len({m.group(1) for m in named if m}) == 1, warnings
    assert "turned UNKNOWN" in warnings[0] and DIED in warnings[0], warnings
    assert all("answered OUTCOME_UNKNOWN (-32012)" in w for w in warnings[1:]), warnings


async def test_a_settle_the_output_schema_rejects_is_refused_answered_clearly_and_corrected(
    node_servers: NodeServers, tmp_path: Path
) -> None:
    store_url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    memory = {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")}
    log = tmp_path / "proxy.stderr"
    command = proxy_command("--name", "memory", "--store", store_url, "--", *node_servers.memory())
    arguments = {"entityNames": ["order-1042"]}
    good = tmp_path / "good.json"
    verdict = {"success": True, "message": "Entities deleted successfully"}
    good.write_text(
        json.dumps(
            {
                "content": [{"type": "text", "text": verdict["message"]}],
                "structuredContent": verdict,
            }
        )
    )
    async with proxy_process(command, log, **memory) as client:
        await client.list_tools()
        manifest = find("memory")  # written by the proxy, with the listing's output schemas
        assert "delete_entities" in manifest.output_schemas
        # An execution whose outcome went unknown (as the first test's did), its record made here.
        scope = default_scope(CallScope(manifest.server, "delete_entities", None, None, None))
        key = store_key(scope, "delete_entities", "k-del")
        store = SQLiteKeyStore(tmp_path / "keys.sqlite3")
        try:
            held = await store.claim(
                key,
                fingerprint("delete_entities", arguments),
                lease=30,
                takeover=False,
                tool="delete_entities",
            )
            assert held.token is not None
            with history_saying(why=DIED, ended="yes"):
                assert await store.leave_unknown(key, held.token)
        finally:
            await store.aclose()
        named = ["--client-key", "k-del", "--tool", "delete_entities"]

        # Known: the proxy's manifest has the tool's output schema; --result-text's shape
        # ({"result": TEXT}) is not it.
        refused = await operator(
            "keys", "settle", "--proxy", "memory", *named, "--result-text", "deleted"
        )
        assert refused == 1
        with pytest.raises(MCPError) as still:
            await client.call_tool("delete_entities", arguments, meta=meta_key("k-del"))
        assert still.value.code == wire.OUTCOME_UNKNOWN and DIED in still.value.message

        # Not known: a store key and a store, no proxy named. Settled; each replay is then
        # answered with what to do (the caller's SDK would raise "Invalid structured content").
        blind = await operator("keys", "settle", key, "--store", store_url, "--result-text", "x")
        assert blind == 0
        for _ in range(2):
            with pytest.raises(MCPError) as unfit:
                await client.call_tool("delete_entities", arguments, meta=meta_key("k-del"))
            assert unfit.value.code == wire.CORRUPT_RECORD, unfit.value
            message = unfit.value.message
            assert "output schema" in message and "'delete_entities'" in message
            assert "keys settle --proxy memory@" in message and "--force" in message
            assert unfit.value.error.data["key"] == "k-del"

        # Corrected: the operator's own settle replaced, with --force (refused without).
        assert await operator("keys", "settle", "--proxy", "memory", *named, "--failed") == 1
        again = ["keys", "settle", "--proxy", "memory", *named, "--result-json", str(good)]
        assert await operator(*again) == 1
        assert await operator(*again, "--force") == 0
        replay = await client.call_tool("delete_entities", arguments, meta=meta_key("k-del"))
        assert status(replay) == "replayed" and replay.structured_content == verdict
    said = log.read_text()
    assert "Traceback" not in said, said
