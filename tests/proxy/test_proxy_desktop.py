"""`mcp-once proxy` as a desktop client runs it, in front of servers nobody here wrote (slow tier).

Each proxy is started the way Claude Desktop, Cursor or Windsurf start a config entry: from `/`,
with only `PATH`, a `HOME` of the test's own and the entry's env. `mcp-server-git` (from the
package index) on two repositories, `@modelcontextprotocol/server-memory` twice with two memory
files, and the same `server-memory` entry in two config files that differ only in its env: the
same client key sent to each runs each upstream's own call (rule 22), on the default stores (in
`HOME`'s state folder: none in the working directory) and on one store they all share, and the
key sent again replays that upstream's own record. An operator then finds a proxy's records by
its name (`--proxy`), a config entry that runs the proxy on itself stops at once, and `tools`
sees through an entry that is already wrapped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import MCPError, StdioServerParameters
from mcp.client import Client
from proxy_kit import NodeServers, lines, meta_key, status, text

from idempotency import wire

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

PROXY = [sys.executable, "-m", "mcp_once", "proxy"]
ENTITY = {"name": "order-1", "entityType": "order", "observations": ["paid"]}
#: The key every upstream is sent.
KEY = "the-same-client-key"
#: A desktop client's working directory.
ROOT = Path("/")


def desktop_env(home: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a desktop client gives an entry: PATH, HOME and the entry's `env`."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), **(env or {})}


def as_desktop(home: Path, argv: list[str], env: dict[str, str] | None = None) -> Any:
    """A config entry `{"command": argv[0], "args": argv[1:], "env": env}` as started from `/`."""
    return StdioServerParameters(
        command=argv[0], args=argv[1:], env=desktop_env(home, env), cwd=str(ROOT)
    )


def git_repository(folder: Path) -> Path:
    """A repository with one commit and a change staged: `git_commit` commits it, once."""
    folder.mkdir()
    for command in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "t@example.test"],
        ["git", "config", "user.name", "t"],
        ["git", "commit", "-q", "--allow-empty", "-m", "start"],
    ):
        subprocess.run(command, cwd=folder, check=True)
    (folder / "change.txt").write_text(f"{folder.name}\n")
    subprocess.run(["git", "add", "change.txt"], cwd=folder, check=True)
    return folder


def commits(repository: Path) -> int:
    done = subprocess.run(
        ["git", "rev-list", "--count", "HEAD"], cwd=repository, capture_output=True, text=True
    )
    return int(done.stdout)


def entities(memory_file: Path) -> list[str]:
    if not memory_file.exists():
        return []
    rows = [json.loads(line) for line in memory_file.read_text().splitlines() if line.strip()]
    return [row["name"] for row in rows if row.get("type") == "entity"]


@dataclass(frozen=True)
class Entry:
    """One desktop config entry behind the proxy: the file and server it is in, its write call,
    and how many effects of that call its own state shows."""

    config: Path
    server: str
    call: tuple[str, dict[str, Any]]
    effects: Callable[[], int]


@dataclass(frozen=True)
class Desk:
    home: Path
    entries: list[Entry]


@pytest.fixture
def desk(tmp_path: Path, node_servers: NodeServers, git_server: Path) -> Desk:
    """Two git servers on two repositories and two memory servers with two files in one config;
    the same memory entry (same name, same command) in two more configs, with two env values."""
    home = tmp_path / "home"
    home.mkdir()
    repos = [git_repository(tmp_path / name) for name in ("repo-a", "repo-b")]
    memory = node_servers.memory()
    files = {name: tmp_path / f"{name}.jsonl" for name in ("work", "home", "one", "two")}

    def memory_entry(name: str) -> dict[str, Any]:
        return {
            "command": memory[0],
            "args": memory[1:],
            "env": {"MEMORY_FILE_PATH": str(files[name])},
        }

    config = tmp_path / "claude_desktop_config.json"
    servers: dict[str, Any] = {
        f"git-{x}": {"command": str(git_server), "args": ["--repository", str(r)]}
        for x, r in zip("ab", repos, strict=True)
    }
    servers |= {f"memory-{name}": memory_entry(name) for name in ("work", "home")}
    config.write_text(json.dumps({"mcpServers": servers}))
    entries = [
        Entry(
            config,
            f"git-{x}",
            ("git_commit", {"repo_path": str(r), "message": "once"}),
            lambda r=r: commits(r) - 1,
        )
        for x, r in zip("ab", repos, strict=True)
    ]
    write = ("create_entities", {"entities": [ENTITY]})
    for name in ("work", "home"):
        entries.append(
            Entry(config, f"memory-{name}", write, lambda f=files[name]: len(entities(f)))
        )
    for name in ("one", "two"):  # the same entry, `memory`, in two files: only its env differs
        other = tmp_path / f"config-{name}.json"
        other.write_text(json.dumps({"mcpServers": {"memory": memory_entry(name)}}))
        entries.append(Entry(other, "memory", write, lambda f=files[name]: len(entities(f))))
    return Desk(home, entries)


async def calls_through(desk: Desk, entry: Entry, store: list[str], times: int) -> list[Any]:
    """Start the wrapped entry as its desktop client would; send its call with `KEY`, `times`."""
    argv = [*PROXY, "--config", str(entry.config), "--server", entry.server, *store]
    async with Client(as_desktop(desk.home, argv)) as client:
        tool, arguments = entry.call
        return [await client.call_tool(tool, arguments, meta=meta_key(KEY)) for _ in range(times)]


@pytest.mark.parametrize("shared", [False, True], ids=["default-stores", "one-shared-store"])
async def test_every_upstream_runs_its_own_call_for_one_client_key(
    desk: Desk, tmp_path: Path, shared: bool
) -> None:
    """One after the other, as a desktop client starts its servers: each upstream's own call
    runs (`executed`, its effect in its own repository or file), and the same key again is that
    record's replay, never another upstream's."""
    store = ["--store", f"sqlite:///{tmp_path / 'shared.sqlite3'}"] if shared else []
    for entry in desk.entries:
        first, again = await calls_through(desk, entry, store, 2)
        where = (entry.config.name, entry.server, text(first))
        assert not first.is_error and status(first) == "executed", where
        assert status(again) == "replayed" and again.content == first.content, where
        assert entry.effects() == 1, where
    state = desk.home / ".local" / "state" / "mcp-once"
    stores = sorted(state.glob("*.sqlite3"))
    assert len(stores) == (0 if shared else len(desk.entries)), stores
    assert len(list(state.glob("*.json"))) == len(desk.entries)  # one manifest per upstream
    assert not (ROOT / ".mcp-once").exists()
    # An operator names one of them: its records only, also where six upstreams share a store.
    keys = [sys.executable, "-m", "mcp_once", "keys", "list", "--json", "--proxy"]
    env = desktop_env(desk.home)
    with anyio.fail_after(120):
        listed = await anyio.run_process([*keys, "git-a"], check=False, env=env)
        both = await anyio.run_process([*keys, "memory"], check=False, env=env)
    assert listed.returncode == 0, listed.stderr.decode()
    assert [r["tool"] for r in json.loads(listed.stdout)] == ["git_commit"]
    assert both.returncode == 2 and "2 upstreams have that name" in both.stderr.decode()


async def test_operators_find_a_proxy_and_its_records_by_its_name(
    node_servers: NodeServers, tmp_path: Path
) -> None:
    """`proxy --list`, then `keys list/show/history/settle/purge` and `audit` with `--proxy
    NAME`, from another folder, with no `--store` or `--server`: a record the upstream's death
    left UNKNOWN is found and settled, and the same key then runs again."""
    home = tmp_path / "home"
    home.mkdir()
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    argv = [*PROXY, "--name", "payments", "--", *node_servers.ledger(ledger)]
    async with Client(as_desktop(home, argv)) as client:
        done = await client.call_tool("charge", {"amount": 3}, meta=meta_key("paid"))
        assert status(done) == "executed"
        with pytest.raises(MCPError) as caught:
            await client.call_tool("charge", {"amount": 4, "crash": "after"}, meta=meta_key("lost"))
        assert caught.value.code == wire.OUTCOME_UNKNOWN

    async def cli(*args: str, code: int = 0) -> str:
        command = [sys.executable, "-m", "mcp_once", *args]
        with anyio.fail_after(120):
            done = await anyio.run_process(
                command, check=False, cwd=tmp_path, env={**desktop_env(home)}
            )
        assert done.returncode == code, (args, done.stderr.decode())
        return done.stdout.decode()

    listed = await cli("proxy", "--list")
    state = home / ".local" / "state" / "mcp-once"
    assert "payments@" in listed and f"sqlite:///{state}/payments-" in listed, listed
    assert "ledger_server.mjs" in listed
    records = json.loads(await cli("keys", "list", "--proxy", "payments", "--json"))
    assert sorted(r["state"] for r in records) == ["completed", "unknown"]
    lost = ["--proxy", "payments", "--client-key", "lost", "--tool", "charge"]
    shown = json.loads(await cli("keys", "show", *lost, "--json"))
    assert shown["state"] == "unknown"
    assert "interrupted" in await cli("keys", "history", *lost)
    assert "settled" in await cli("keys", "settle", *lost, "--failed", "--force")
    assert "settled" in await cli("audit", "--proxy", "payments", "--event", "settled")
    assert "every chain holds" in await cli("audit", "verify", "--proxy", "payments")
    assert "purged 0" in await cli("keys", "purge", "--proxy", "payments")
    async with Client(as_desktop(home, argv)) as client:
        again = await client.call_tool("charge", {"amount": 4}, meta=meta_key("lost"))
        assert status(again) == "executed"
    assert lines(ledger / "effects") == 3


def processes_naming(marker: str) -> set[int]:
    """The processes whose command line contains `marker`."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.add(int(entry))
    return found


@dataclass(frozen=True)
class Watched:
    code: int
    stderr: str
    #: Seconds from start to exit, on the wall clock and of CPU (the process and its children).
    wall: float
    cpu: float
    #: Every process seen whose command line named the marker.
    seen: set[int]


def run_watching(argv: list[str], home: Path, marker: str, log: Path) -> Watched:
    """Run `argv` as a desktop client would, until it exits on its own (60 s at most), noting
    every process whose command line names `marker` meanwhile."""
    started = time.monotonic()
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=desktop_env(home),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    seen: set[int] = set()
    done = (0, 0, None)
    while time.monotonic() - started < 60.0 and not done[0]:
        seen |= processes_naming(marker)
        done = os.wait4(process.pid, os.WNOHANG)
    wall = time.monotonic() - started
    if not done[0]:
        os.killpg(process.pid, signal.SIGKILL)
        done = os.wait4(process.pid, 0)
    _, status, usage = done
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    assert process.stdin is not None
    process.stdin.close()
    assert usage is not None
    cpu = usage.ru_utime + usage.ru_stime
    return Watched(process.returncode, log.read_text(), wall, cpu, seen)


async def test_a_config_entry_that_runs_the_proxy_on_itself_stops_at_once(tmp_path: Path) -> None:
    """The docs' `mcp-once proxy --config FILE --server memory`, put in FILE as the entry
    `memory` itself: exit 2 naming the loop, the one proxy the client started the only one ever
    alive (measured before: one more every ~1.5 s, without end): the loop is seen in the entry's
    command line, before FastMCP is imported. A loop no command line shows (a script that runs
    the proxy) is stopped by the chain in the child's environment, one level down: two proxies.

    "At once" is measured in CPU seconds (the proxy's and its children's): under 5 s, the CLI's
    own start (~1.5 s here) and nothing more; on a shared, loaded test machine the wall clock
    measures the machine (it must still exit on its own within 60 s)."""
    home = tmp_path / "home"
    home.mkdir()
    config = tmp_path / "claude_desktop_config.json"
    script = tmp_path / "start-proxy.sh"
    script.write_text(f'exec "$@" --config "{config}" --server hidden\n')
    itself = [*PROXY[1:], "--config", str(config), "--server", "memory"]
    servers = {
        "memory": {"command": sys.executable, "args": itself},
        "hidden": {"command": "/bin/sh", "args": [str(script), *PROXY]},
    }
    config.write_text(json.dumps({"mcpServers": servers}))
    for server, most in (("memory", 1), ("hidden", 2)):
        entry = servers[server]
        argv = [entry["command"], *entry["args"]]
        log = tmp_path / f"{server}.stderr"
        run = await anyio.to_thread.run_sync(run_watching, argv, home, str(config), log)
        assert run.code == 2, (server, run)
        assert run.cpu < 5.0 and len(run.seen) <= most, (server, run)
        assert f"proxy loop: '{server}' -> '{server}'" in run.stderr, run
        assert "Traceback" not in run.stderr, run


async def test_tools_sees_through_an_entry_that_is_already_wrapped(
    node_servers: NodeServers, tmp_path: Path
) -> None:
    memory = node_servers.memory()
    config = tmp_path / "config.json"
    wrapping = [*PROXY[1:], "--config", str(config), "--server", "memory"]
    servers = {
        "memory": {"command": memory[0], "args": memory[1:]},
        "memory-once": {"command": sys.executable, "args": wrapping},
    }
    config.write_text(json.dumps({"mcpServers": servers}))
    command = [sys.executable, "-m", "mcp_once", "tools", "--config", str(config)]
    with anyio.fail_after(120):
        done = await anyio.run_process([*command, "--server", "memory-once", "--json"], check=False)
    said = done.stderr.decode()
    assert done.returncode == 0, said
    assert (
        f"'memory-once' is already wrapped: it runs mcp-once proxy in front of {memory[0]}" in said
    )
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert rows["create_entities"]["action"] == "guarded"
    assert rows["read_graph"]["action"] == "pass-through"


async def test_the_front_is_the_upstreams_server_and_the_command_needs_no_dashes(
    node_servers: NodeServers, tmp_path: Path
) -> None:
    """`serverInfo` is server-memory's name and version, the proxy named in its title; the
    command line follows the options without `--`, as the MCP Inspector's CLI passes it."""
    memory = node_servers.memory()
    env = {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")}
    home = tmp_path / "home"
    home.mkdir()
    async with Client(as_desktop(home, memory, env)) as direct:
        upstream = direct.server_info
    argv = [*PROXY, "--store", f"sqlite:///{tmp_path / 'keys.sqlite3'}", *memory]
    async with Client(as_desktop(home, argv, env)) as client:
        info = client.server_info
        listed = await client.list_tools()
    assert (info.name, info.version) == (upstream.name, upstream.version)
    assert info.title is not None and " via mcp-once proxy: " in info.title
    assert info.title.startswith(upstream.title or upstream.name)
    assert "create_entities" in [tool.name for tool in listed.tools]


async def test_a_state_folder_that_cannot_be_written_stops_the_proxy_in_one_line(
    tmp_path: Path,
) -> None:
    """Started from `/` with a `HOME` that cannot hold a folder: exit 2, one line naming the
    folder and `--store`, no traceback, and no `.mcp-once` anywhere."""
    home = tmp_path / "home"
    home.write_text("a file, not a folder")
    argv = [*PROXY, "--", sys.executable, "-c", "pass"]
    with anyio.fail_after(60):
        done = await anyio.run_process(argv, check=False, cwd=ROOT, env=desktop_env(home))
    said = done.stderr.decode()
    assert done.returncode == 2, said
    assert said.count("\n") == 1, said
    assert f"cannot write the state folder {home}/.local/state/mcp-once" in said
    assert "--store" in said
    assert not (ROOT / ".mcp-once").exists()
