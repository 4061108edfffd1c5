"""docs/runbook.md and the `keys` help cannot rot: every command in the runbook parses, the ones
that only read run against a store the example server wrote (so the server name it gives for
`--server` finds the record), and the example servers' names it and the help give are the names
those servers really have."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from cli_run import cli
from mcp.client import Client

from idempotency import SQLiteKeyStore, wire
from mcp_once._cli import build_parser
from mcp_once._cli._example_server import SERVER_NAME, build_server
from mcp_once._cli._keys import EXAMPLE_SERVERS

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"


def runbook_commands() -> list[list[str]]:
    """Every `mcp-once ...` line of the runbook's shell blocks, split as a shell would."""
    blocks = re.findall(r"```sh\n(.*?)```", RUNBOOK.read_text(), flags=re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("mcp-once ")]


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


async def test_the_runbooks_reading_commands_run_against_the_example_servers_records(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The runbook's own client key, tool and server name address the record the example
    server wrote; every listing, show and purge command it gives runs and succeeds."""
    path = tmp_path / "keys.sqlite3"
    store = SQLiteKeyStore(path)
    try:
        async with Client(build_server(store)) as client:
            result = await client.call_tool(
                "charge",
                {"order_id": "1042", "cents": 500},
                meta={wire.KEY_META: "order-1042-charge"},
            )
        assert not result.is_error
    finally:
        await store.aclose()
    # settle writes; reconcile names the reader's own app (`--app`), tested in
    # test_keys_reconcile; `audit --follow` runs until stopped: its options are read by the others.
    # A proxy's commands (`proxy --list`, `--proxy NAME`) read a proxy's records: run against
    # real proxies in tests/proxy/test_proxy_desktop.py.
    writing = (["keys", "settle"], ["keys", "reconcile"])
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
        assert ran.code == 0, (argv, ran.err)
        if argv[1] == "show":
            assert "state: completed" in ran.out and "tool: charge" in ran.out
        if argv[1] == "history":
            assert [line.split()[1] for line in ran.out.splitlines()[1:]] == [
                "claimed",
                "completed",
            ]
