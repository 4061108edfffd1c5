"""The npm reference servers behind `mcp-once proxy`, stdio and HTTP fronts (the slow tier).

`@modelcontextprotocol/server-memory`, `-everything` and `-filesystem`, each a stdio child of the
proxy behind a tap that counts the `tools/call` requests on the upstream link (`tap.py`): a call
whose answer `orchestrator.chaos` loses is re-sent by the caller's `RetryingSession` under the same
key, reaches the upstream once and is answered with the replay; a read-only tool passes through.
Besides the tap, each server's own state shows the one effect: the graph file of `-memory`, the
toggle of `-everything` (a second run would switch it back off), the file `-filesystem` edits (a
second run would add a second line).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import StdioServerParameters
from mcp.client import Client
from mcp_types import CallToolResult
from proxy_kit import (
    NodeServers,
    announced,
    http_url,
    meta_key,
    proxy_command,
    status,
    tapped,
    text,
)

from orchestrator import RetryingSession, RetryPolicy
from orchestrator.chaos import Chaos, Fault, FaultPlan

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

#: Long enough for a call through the proxy to a node child; the lost answer waits this long.
ATTEMPT = 5.0

Call = tuple[str, dict[str, Any]]
#: After the lost answer and the replay: checks the upstream's own state (it may call again).
Check = Callable[[Path, Client, Path], Awaitable[None]]


@dataclass(frozen=True)
class Peer:
    """One reference server: its package and command-line arguments in the test's folder, the
    guarded call whose answer is lost, the read-only call, and the check of its own state."""

    package: str
    args: Callable[[Path], list[str]]
    env: Callable[[Path], dict[str, str]]
    write: Callable[[Path], Call]
    read: Callable[[Path], Call]
    one_effect: Check

    def __str__(self) -> str:
        return self.package


def counted(count: Path) -> list[str]:
    """The tools called on the upstream link, in order."""
    return count.read_text().splitlines() if count.exists() else []


# -- server-memory: a knowledge graph in a JSONL file ----------------------------------------

ENTITY = {"name": "order-1", "entityType": "order", "observations": ["paid"]}


async def _memory_one_entity(folder: Path, client: Client, count: Path) -> None:
    rows = [json.loads(line) for line in (folder / "memory.jsonl").read_text().splitlines()]
    assert [r["name"] for r in rows if r.get("type") == "entity"] == ["order-1"]


MEMORY = Peer(
    "server-memory",
    args=lambda folder: [],
    env=lambda folder: {"MEMORY_FILE_PATH": str(folder / "memory.jsonl")},
    write=lambda folder: ("create_entities", {"entities": [ENTITY]}),
    read=lambda folder: ("read_graph", {}),
    one_effect=_memory_one_entity,
)


# -- server-everything: a toggle whose second run switches it back ---------------------------


async def _everything_toggled_once(folder: Path, client: Client, count: Path) -> None:
    """Toggled once: the next toggle, under a new key, stops what the first one started."""
    again = await client.call_tool("toggle-subscriber-updates", {}, meta=meta_key("toggle-2"))
    assert status(again) == "executed" and text(again).startswith("Stopped")
    assert counted(count)[-1] == "toggle-subscriber-updates"


EVERYTHING = Peer(
    "server-everything",
    args=lambda folder: ["stdio"],
    env=lambda folder: {},
    write=lambda folder: ("toggle-subscriber-updates", {}),
    read=lambda folder: ("echo", {"message": "hello"}),
    one_effect=_everything_toggled_once,
)


# -- server-filesystem: files under one allowed root -----------------------------------------


def _notes(folder: Path) -> Path:
    return folder / "root" / "notes.txt"


def _prepare_root(folder: Path) -> list[str]:
    _notes(folder).parent.mkdir()
    _notes(folder).write_text("END\n")
    return [str(folder / "root")]


async def _filesystem_one_line(folder: Path, client: Client, count: Path) -> None:
    """One edit on disk; and `create_directory` / `write_file` re-sent: one call upstream each."""
    assert _notes(folder).read_text() == "entry\nEND\n"
    made = folder / "root" / "made"
    for tool, arguments in [
        ("create_directory", {"path": str(made)}),
        ("write_file", {"path": str(made / "a.txt"), "content": "once"}),
    ]:
        calls = [await client.call_tool(tool, arguments, meta=meta_key(tool)) for _ in range(2)]
        assert [status(c) for c in calls] == ["executed", "replayed"]
        assert counted(count).count(tool) == 1
    assert (made / "a.txt").read_text() == "once"


FILESYSTEM = Peer(
    "server-filesystem",
    args=_prepare_root,
    env=lambda folder: {},
    write=lambda folder: (
        "edit_file",
        {"path": str(_notes(folder)), "edits": [{"oldText": "END", "newText": "entry\nEND"}]},
    ),
    read=lambda folder: ("read_text_file", {"path": str(_notes(folder))}),
    one_effect=_filesystem_one_line,
)


@contextlib.contextmanager
def proxy_target(front: str, command: list[str]) -> Iterator[StdioServerParameters | str]:
    """What the caller connects to: the proxy as its stdio child, or the `--listen` proxy's URL."""
    if front == "stdio":
        yield StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
        return
    with announced(command, "mcp-once proxy at ") as line:
        yield http_url(line)


@pytest.mark.parametrize("peer", [MEMORY, EVERYTHING, FILESYSTEM], ids=str)
@pytest.mark.parametrize("front", ["stdio", "http"])
async def test_reference_server_lost_answer_reaches_the_upstream_once(
    node_servers: NodeServers, tmp_path: Path, front: str, peer: Peer
) -> None:
    count = tmp_path / "tools-calls"
    env_tool = shutil.which("env")
    assert env_tool is not None
    settings = [f"{name}={value}" for name, value in peer.env(tmp_path).items()]
    upstream = [env_tool, *settings, *node_servers.reference(peer.package, *peer.args(tmp_path))]
    options = ["--store", f"sqlite:///{tmp_path / 'keys.sqlite3'}"]
    if front == "http":
        options += ["--listen", "127.0.0.1:0"]
    command = proxy_command(*options, "--", *tapped(count, upstream))
    write_tool, write_arguments = peer.write(tmp_path)
    read_tool, read_arguments = peer.read(tmp_path)
    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}, tools={write_tool}), seed=1)
    with proxy_target(front, command) as target:
        async with Client(chaos.wrap(target)) as client:
            retrying = RetryingSession(client, policy=RetryPolicy(attempt_timeout=ATTEMPT))
            result: CallToolResult = await retrying.call_tool(
                write_tool, write_arguments, idempotency_key="key-1"
            )
            assert not result.is_error, text(result)
            assert status(result) == "replayed"
            assert [a.failure for a in retrying.last_report.attempts] == ["maybe_executed", None]
            assert counted(count) == [write_tool]
            # The same key once more, straight: the record's answer, still one upstream call.
            again = await client.call_tool(write_tool, write_arguments, meta=meta_key("key-1"))
            assert status(again) == "replayed" and again.content == result.content
            assert counted(count) == [write_tool]
            # A read-only tool passes through: no record, no marker, the upstream answers.
            read = await client.call_tool(read_tool, read_arguments, meta=meta_key("read-1"))
            assert not read.is_error and status(read) is None
            assert counted(count) == [write_tool, read_tool]
            await peer.one_effect(tmp_path, client, count)
