"""`mcp-once wrap` on real configs of each client's shape, then every wrapped entry started as its
client starts it (slow tier).

The configs name real upstreams: the npm `server-memory` (by `node` on PATH, and by a script of
its own with no `args`), a Python stdio server with an effect ledger, and a TypeScript-SDK
server with an effect ledger over streamable HTTP (the URL entries: `url`, Windsurf's
`serverUrl`, `"type": "http"`). `mcp-once wrap` (the console script, as a user runs it) rewrites
each file and lists each entry's tools, starting each server; then each wrapped entry is started
from `/`, with only `PATH`, a `HOME` of the test's own and the entry's `env`, the command being
the absolute path written into the file: it lists its upstream's tools, its write runs once for
a key, and the key sent again is replayed; `--undo` gives the file back byte for byte. A server
that cannot start, or does not answer in `--timeout`, is a row of the report, not a failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client import Client
from proxy_kit import (
    HERE,
    NodeServers,
    announced,
    lines,
    meta_key,
    node_port_url,
    status,
)
from test_proxy_desktop import ENTITY, as_desktop, entities

from mcp_once._cli._jsonc import parse

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

#: The console script of this environment: how a user runs `mcp-once wrap`.
MCP_ONCE = str(Path(sys.executable).with_name("mcp-once"))
CHANGING = HERE / "changing_server.py"


@dataclass(frozen=True)
class Upstreams:
    """The real servers the configs name, and how to count each one's effects."""

    memory: list[str]
    #: A script that starts server-memory, for an entry with no `args`.
    memory_script: Path
    changing: list[str]
    changing_ledger: Path
    http_url: str
    http_ledger: Path


@dataclass(frozen=True)
class Check:
    """What one wrapped entry must do: a tool of its upstream, a write call and its effects."""

    tool: str
    call: tuple[str, dict[str, Any]]
    effects: Callable[[], int]


@pytest.fixture
def upstreams(tmp_path: Path, node_servers: NodeServers) -> Iterator[Upstreams]:
    memory = node_servers.memory()
    script = tmp_path / "bin" / "memory-server"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\nexec {' '.join(memory)}\n")
    script.chmod(0o755)
    ledger = tmp_path / "http-ledger"
    ledger.mkdir()
    changing = tmp_path / "changing.ledger"
    command = node_servers.ledger(ledger, "--port", "0")
    with announced(command, "PORT ", stream="stdout") as port:
        yield Upstreams(
            memory=memory,
            memory_script=script,
            changing=[sys.executable, str(CHANGING), str(changing)],
            changing_ledger=changing,
            http_url=node_port_url(port),
            http_ledger=ledger / "effects",
        )


def memory_check(file: Path) -> Check:
    return Check(
        "read_graph", ("create_entities", {"entities": [ENTITY]}), lambda: len(entities(file))
    )


def configs(tmp_path: Path, up: Upstreams) -> dict[Path, dict[str, Check]]:
    """One config file of each client's shape, and what each of its entries must do."""
    folder = tmp_path / "configs"
    folder.mkdir()
    files = {n: tmp_path / f"memory-{n}.jsonl" for n in ("desktop", "code", "cursor", "wind", "vs")}
    node, index = up.memory
    http = Check("charge", ("charge", {"amount": 3}), lambda: lines(up.http_ledger))
    changing = Check("write", ("write", {"text": "once"}), lambda: lines(up.changing_ledger))
    found: dict[Path, dict[str, Check]] = {}

    def write(name: str, text: str, checks: dict[str, Check]) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode())
        found[path] = checks

    desktop = {
        "globalShortcut": "Alt+Space",
        "mcpServers": {
            "memory": {
                "command": "node",
                "args": [index],
                "env": {"MEMORY_FILE_PATH": str(files["desktop"])},
            }
        },
    }
    write(
        "claude/claude_desktop_config.json",
        json.dumps(desktop, indent=2) + "\n",
        {"memory": memory_check(files["desktop"])},
    )
    project = {
        "mcpServers": {
            "changing": {"type": "stdio", "command": up.changing[0], "args": up.changing[1:]},
            "ledger": {"type": "http", "url": up.http_url},
        }
    }
    write("code/.mcp.json", json.dumps(project, indent=2), {"changing": changing, "ledger": http})
    user = {
        "numStartups": 3,
        "projects": {
            str(tmp_path): {
                "mcpServers": {
                    "memory": {
                        "type": "stdio",
                        "command": node,
                        "args": [index],
                        "env": {"MEMORY_FILE_PATH": str(files["code"])},
                    }
                }
            }
        },
    }
    write(".claude.json", json.dumps(user, indent=2), {"memory": memory_check(files["code"])})
    cursor = {
        "mcpServers": {
            "local": {
                "command": str(up.memory_script),
                "env": {"MEMORY_FILE_PATH": str(files["cursor"])},
            },
            "remote": {"url": up.http_url},
        }
    }
    write(
        ".cursor/mcp.json",
        json.dumps(cursor, indent=2),
        {"local": memory_check(files["cursor"]), "remote": http},
    )
    windsurf = {
        "mcpServers": {
            "memory": {
                "command": node,
                "args": [index],
                "env": {"MEMORY_FILE_PATH": str(files["wind"])},
                "disabled": False,
            },
            "remote": {"serverUrl": up.http_url},
        }
    }
    text = json.dumps(windsurf, indent="\t").replace("\n", "\r\n") + "\r\n"
    write(
        ".codeium/windsurf/mcp_config.json",
        text,
        {"memory": memory_check(files["wind"]), "remote": http},
    )
    vscode = f"""{{
  // this workspace's servers
  "servers": {{
    "memory": {{
      "type": "stdio",
      "command": {json.dumps(node)},
      "args": [{json.dumps(index)},],
      "env": {{"MEMORY_FILE_PATH": {json.dumps(str(files["vs"]))}}},
    }},
    /* the team's */
    "remote": {{"type": "http", "url": {json.dumps(up.http_url)}}},
  }},
}}
"""
    write(".vscode/mcp.json", vscode, {"memory": memory_check(files["vs"]), "remote": http})
    return found


def run_wrap(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MCP_ONCE, "wrap", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def servers_of(path: Path) -> dict[str, Any]:
    """A config's server entries, read as its client reads it (JSONC for VS Code)."""
    root = parse(path.read_text()).root.value()
    if "servers" in root:
        return dict(root["servers"])
    if "projects" in root:
        return {n: e for p in root["projects"].values() for n, e in p["mcpServers"].items()}
    return dict(root["mcpServers"])


async def test_every_wrapped_entry_runs_as_its_client_starts_it(
    tmp_path: Path, upstreams: Upstreams
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    found = configs(tmp_path, upstreams)
    originals = {path: path.read_bytes() for path in found}
    for path, checks in found.items():
        done = await anyio.to_thread.run_sync(lambda p=path: run_wrap(str(p), cwd=tmp_path))
        assert done.returncode == 0, (path, done.stdout, done.stderr)
        for name, check in checks.items():
            row = next(line for line in done.stdout.splitlines() if line.startswith(name + " "))
            assert " wrapped " in row and " tools: " in row, (path, row)
            assert f"\n{check.tool} " in done.stdout, (path, name)
        servers = servers_of(path)
        assert set(servers) == set(checks)
        for name, check in checks.items():
            entry = servers[name]
            assert entry["command"] == MCP_ONCE and Path(MCP_ONCE).is_absolute()
            assert entry["args"][:3] == ["proxy", "--name", name]
            argv = [entry["command"], *entry["args"]]
            before = check.effects()
            async with Client(as_desktop(home, argv, entry.get("env"))) as client:
                listed = [tool.name for tool in (await client.list_tools()).tools]
                assert check.tool in listed, (path, name, listed)
                tool, arguments = check.call
                key = f"{path.parent.name}-{name}"
                first = await client.call_tool(tool, arguments, meta=meta_key(key))
                again = await client.call_tool(tool, arguments, meta=meta_key(key))
            where = (path, name)
            assert status(first) == "executed" and not first.is_error, where
            assert status(again) == "replayed" and again.content == first.content, where
            assert check.effects() == before + 1, where
    assert not (Path("/") / ".mcp-once").exists()
    # Undone (byte for byte, as tests/cli/test_wrap.py shows for every shape): one run.
    desktop = next(iter(originals))
    undone = await anyio.to_thread.run_sync(lambda: run_wrap(str(desktop), "--undo", cwd=tmp_path))
    assert undone.returncode == 0 and desktop.read_bytes() == originals[desktop], undone.stderr


async def test_a_server_that_cannot_start_is_a_row_of_the_report(
    tmp_path: Path, upstreams: Upstreams
) -> None:
    """No such command, a server that never answers (`--timeout`): both reported in the tools
    column, the file wrapped all the same (exit 0), the others' tools listed."""
    path = tmp_path / "mcp.json"
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    servers = {
        "missing": {"command": str(tmp_path / "no-such-server")},
        "silent": {"command": sleeper[0], "args": sleeper[1:]},
        "changing": {"command": upstreams.changing[0], "args": upstreams.changing[1:]},
    }
    path.write_text(json.dumps({"mcpServers": servers}, indent=2))
    done = await anyio.to_thread.run_sync(
        lambda: run_wrap(str(path), "--timeout", "10", cwd=tmp_path)
    )
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[1:4]}
    assert "not listed: [Errno 2] No such file or directory" in rows["missing"], done.stdout
    assert "not listed: no answer within 10 s" in rows["silent"], done.stdout
    assert "2 tools: 2 guarded, 0 pass-through" in rows["changing"], done.stdout
    assert all(e["command"] == MCP_ONCE for e in servers_of(path).values())
    assert path.with_name(path.name + ".mcp-once.bak").is_file()
