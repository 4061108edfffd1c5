"""docs/runbook.md and the `keys` help cannot rot: every command in the runbook parses, the ones
that only read run against a store the example server and a payments server wrote (so the server
names it gives for `--server` find the records, and the lookup without `--server` names both), the
header of each transcript is what the command prints, and the example servers' names it and the
help give are the names those servers really have. Its `keys reconcile --app payments:server`
runs as written in tests/examples/test_reconcile_example.py (it needs the payment provider)."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_run import cli
from mcp.client import Client
from mcp.server.mcpserver import MCPServer

from idempotency import SQLiteKeyStore, idempotent, wire
from mcp_once._cli import build_parser
from mcp_once._cli._example_server import SERVER_NAME, build_server
from mcp_once._cli._keys import EXAMPLE_SERVERS

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"
EXAMPLES = ROOT / "examples"
#: The client key the runbook follows.
KEY = "order-1042-charge"
META = {wire.KEY_META: KEY}


def transcripts() -> list[tuple[list[str], list[str]]]:
    """Every `$ mcp-once ...` line of the runbook's console blocks, split as a shell would, with
    the output the transcript shows for it."""
    blocks = re.findall(r"```console\n(.*?)```", RUNBOOK.read_text(), flags=re.S)
    found: list[tuple[list[str], list[str]]] = []
    for block in blocks:
        for line in (line.strip() for line in block.splitlines()):
            if line.startswith("$ "):
                argv = shlex.split(line[2:])
                found.append((argv[1:] if argv[0] == "mcp-once" else [], []))
            elif found:
                found[-1][1].append(line)
    for _, out in found:
        while out and not out[-1]:  # the indent before a list item's closing fence
            out.pop()
    return [(argv, out) for argv, out in found if argv]


def runbook_commands() -> list[list[str]]:
    """Every `mcp-once ...` command of the runbook, each once, in order."""
    commands: list[list[str]] = []
    for argv, _ in transcripts():
        if argv not in commands:
            commands.append(argv)
    return commands


def test_every_runbook_command_parses() -> None:
    commands = runbook_commands()
    assert len(commands) >= 10
    for argv in commands:
        build_parser().parse_args(argv)  # an unknown flag or bad value exits 2 here


def fastmcp_example_name(monkeypatch: pytest.MonkeyPatch) -> str:
    pytest.importorskip("fastmcp")
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.setattr(sys, "argv", ["fastmcp_server.py"])
    import fastmcp_server

    from idempotency import MemoryKeyStore

    return str(fastmcp_server.build_server(MemoryKeyStore()).name)


def test_the_example_server_names_given_are_the_real_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert set(EXAMPLE_SERVERS) == {SERVER_NAME, fastmcp_example_name(monkeypatch)}
    keys = build_parser()._subparsers._group_actions[0].choices["keys"]  # type: ignore[union-attr]
    runbook = RUNBOOK.read_text()
    for name in EXAMPLE_SERVERS:
        assert f"`{name}`" in runbook and name in (keys.epilog or "")
    assert "docs/runbook.md" in (keys.epilog or "")


def test_the_runbook_covers_every_code_an_operator_meets() -> None:
    table = RUNBOOK.read_text().split("## At a glance", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    firsts = [row.split("|")[1].strip() for row in rows]
    codes = [wire.IN_PROGRESS, wire.OUTCOME_UNKNOWN, wire.STORE_UNAVAILABLE, wire.CORRUPT_RECORD]
    assert [str(code) for code in codes] + ["UNKNOWN"] == [f for f in firsts if f[0] in "-U"]
    for row in rows[1:]:  # after the header (the separator line starts "|-")
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        assert len(cells) == 6 and all(cells), row  # meaning, ran?, agent and operator: all said


def shape(line: str) -> list[str]:
    """A transcript's first line as far as it does not depend on the store: its first words
    but the counts."""
    return [word for word in line.split()[:3] if not word.isdigit()]


async def wrote(
    store: SQLiteKeyStore, server: MCPServer, arguments: dict[str, Any], key: str
) -> None:
    async with Client(server) as client:
        result = await client.call_tool("charge", arguments, meta={wire.KEY_META: key})
    assert not result.is_error


def payments(store: SQLiteKeyStore) -> MCPServer:
    """A server named as the runbook's payments server, with its tool `charge`: its records
    are named as that server's (the provider's part is not what these commands read)."""
    server = MCPServer("payments")

    @server.tool()
    @idempotent(store)
    async def charge(order: str, cents: int) -> dict[str, Any]:
        return {"charge": f"ch_{order}", "order": order, "amount": cents}

    return server


async def test_the_runbooks_reading_commands_run_against_the_example_servers_records(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The runbook's own client keys, tool and server names address the records the example
    server and a payments server wrote; every listing, show, history, audit and purge command it
    gives runs, and prints what its transcript shows first (the table's header)."""
    path = tmp_path / "keys.sqlite3"
    store = SQLiteKeyStore(path)
    try:
        await wrote(store, build_server(store), {"order_id": "1042", "cents": 500}, KEY)
        for order in ("1042", "1043"):
            await wrote(
                store, payments(store), {"order": order, "cents": 500}, f"order-{order}-charge"
            )
    finally:
        await store.aclose()
    # settle and reconcile write (reconcile also needs the payments app's provider: it runs in
    # tests/examples); `audit --follow` runs until stopped: its options are read by the others.
    # A proxy's commands (`proxy --list`, `--proxy NAME`) read a proxy's records: run against
    # real proxies in tests/proxy/test_proxy_desktop.py.
    writing = (["keys", "settle"], ["keys", "reconcile"])
    shown = {tuple(argv): out for argv, out in transcripts()}
    reading = [
        argv
        for argv in runbook_commands()
        if argv[:2] not in writing
        and "--follow" not in argv
        and "--proxy" not in argv
        and argv[0] != "proxy"
    ]
    assert {tuple(argv[:2]) for argv in reading} == {
        ("keys", "list"),
        ("keys", "show"),
        ("keys", "purge"),
        ("keys", "history"),
        ("audit", "--since"),
        ("audit", "verify"),
    }
    for argv in reading:
        ran = await cli(capsys, *argv, "--store", f"sqlite:///{path}")
        first = (ran.out or ran.err).splitlines()[0]
        if first != "mcp-once: no events":  # this store has no `lease ran out`
            assert shape(first) == shape(shown[tuple(argv)][0]), (argv, ran)
        if argv[1] == "show" and "--server" not in argv:  # the lookup: names both servers
            assert ran.code == 1, (argv, ran)
            assert "server 'mcp-once-example': store key" in ran.err
            assert "server 'payments': store key" in ran.err
            continue
        assert ran.code == 0, (argv, ran.err)
        if argv[1] == "show":
            assert "state: completed" in ran.out and "server: payments" in ran.out
        if argv[1] == "history":
            assert [line.split()[1] for line in ran.out.splitlines()[1:]] == [
                "claimed",
                "completed",
            ]


async def test_the_runbooks_reconcile_commands_run_as_written_on_killed_processes(
    tmp_path: Path,
) -> None:
    """The runbook's `keys reconcile --app payments:server` commands, run as written where it
    runs them (`examples/`, `$MCP_ONCE_STORE` and `$PAYMENT_PROVIDER_URL` set), on the record a
    payments worker left when it was SIGKILLed right after the provider charged: the dry run and
    the run print what the transcripts show, the provider holds one charge, and the history
    names the operator."""
    sys.path.insert(0, str(EXAMPLES))
    from payment_provider import ProviderClient
    from reconcile import server_params, start_provider

    proc, url = start_provider(tmp_path / "charges.db")
    store = f"sqlite:///{tmp_path}/keys.sqlite3"
    env = {**os.environ, "MCP_ONCE_STORE": store, "PAYMENT_PROVIDER_URL": url}
    script = str(Path(sys.executable).with_name("mcp-once"))
    shown = {tuple(argv): out for argv, out in transcripts()}
    try:
        with anyio.fail_after(120):
            with pytest.raises(Exception) as died:  # the transport of a dead child
                async with Client(server_params(store, url, "--die", "after-charge")) as client:
                    await client.call_tool("charge", {"order": "1042", "cents": 500}, meta=META)
            assert not isinstance(died.value, AssertionError)
            await lease_ran_out(store)
            ran = []
            for argv in runbook_commands():
                if argv[:2] == ["keys", "reconcile"]:
                    done = await anyio.run_process(
                        [script, *argv], cwd=EXAMPLES, env=env, check=False
                    )
                    ran.append((argv, done.returncode, done.stdout.decode().splitlines()))
        charges = ProviderClient(url).charges()
    finally:
        proc.terminate()
        proc.wait()
    (dry, dry_code, dry_out), (real, real_code, real_out), *later = ran
    assert "--dry-run" in dry and dry_code == 0 and dry_out == shown[tuple(dry)]
    assert "--by" in real and real_code == 0 and real_out == shown[tuple(real)]
    assert all(code == 0 and out == ["no UNKNOWN records"] for _, code, out in later)
    assert [(c["order"], c["requests"]) for c in charges] == [("1042", 1)]
    history = await anyio.run_process(
        [script, "keys", "history", "--client-key", KEY, "--tool", "charge", "--server",
         "payments", "--json"], env=env,
    )  # fmt: skip
    [verdict] = [e for e in json.loads(history.stdout) if e["event"] == "reconciled"]
    assert (verdict["answer"], verdict["by"]) == ("happened", "ana@ops")
    assert not (EXAMPLES / ".mcp-once").exists()  # the app used $MCP_ONCE_STORE


async def lease_ran_out(url: str) -> None:
    """Waits (polling the store) until the killed worker's lease is over on this clock."""
    store = SQLiteKeyStore(url.removeprefix("sqlite:///"))
    try:
        while True:
            [record] = await store.list_records()
            if record.lease_deadline is not None and record.lease_deadline <= time.time():
                return
            await anyio.sleep(0.05)
    finally:
        await store.aclose()
