"""Operator commands start without the MCP SDK (issue 48, item 7): `mcp-once --help`, `keys` and
`audit` read a store and print, so they import neither `mcp` nor what it stands on (pydantic and
the protocol types, ~1 s of the old start-up), nor FastMCP, nor the client library. Only the
commands that talk MCP (proxy, tools, demo, serve-example) load it, when they run.

Each command runs in a fresh interpreter (`python -c`, through `main`) that then reports which
top-level packages it imported: the one measurement of "imported" that an earlier import in the
test process cannot spoil.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_run import private_redis_server
from mcp import StdioServerParameters
from mcp.client import Client
from redis_server import RedisServer

from benchmarks import _populate
from mcp_once._cli._common import EXIT_USAGE

#: Loaded only by commands that talk MCP (pydantic and mcp_types: what `mcp` stands on).
SDK = {"mcp", "mcp_types", "pydantic", "pydantic_core", "fastmcp", "orchestrator", "uvicorn"}
#: Not needed by a command on an SQLite store either: redis-py (which itself loads the
#: OpenTelemetry SDK) and OpenTelemetry (`audit --otel` loads it).
NOT_FOR_SQLITE = {"redis", "opentelemetry"}
#: A store key no record has.
ABSENT = "0" * 64

_REPORT = """
import json, sys
from mcp_once._cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exc:
    status = exc.code
print(json.dumps({"status": status, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def imported_by(*argv: str, cwd: Path) -> tuple[object, set[str]]:
    """The exit status of `mcp-once *argv` and the top-level packages its process imported."""
    done = subprocess.run(
        [sys.executable, "-c", _REPORT, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["status"], set(report["modules"])


@pytest.fixture(scope="module")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("startup") / "keys.db"
    _populate.fill_sqlite(path, 20, unknown_every=7, running_every=11)
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    yield from private_redis_server("CLI start-up")


@pytest.fixture(scope="module")
def redis_url(redis_server: RedisServer) -> str:
    _populate.fill_redis(redis_server.url, 20, unknown_every=7, running_every=11)
    return redis_server.url


HELP = [["--help"], ["keys", "list", "--help"]]
ON_A_STORE = [
    ["keys", "list"],
    ["keys", "list", "--state", "unknown"],
    ["keys", "show", ABSENT],
    ["keys", "history", ABSENT],
    ["keys", "settle", ABSENT, "--failed"],
    ["keys", "purge"],
    ["audit"],
    ["audit", "verify"],
]


@pytest.mark.parametrize("argv", HELP, ids=" ".join)
def test_help_loads_no_sdk(argv: list[str], tmp_path: Path) -> None:
    status, modules = imported_by(*argv, cwd=tmp_path)
    assert status == 0
    assert modules & (SDK | NOT_FOR_SQLITE) == set()


@pytest.mark.parametrize("argv", ON_A_STORE, ids=" ".join)
def test_operator_commands_on_sqlite_load_no_sdk(
    argv: list[str], sqlite_url: str, tmp_path: Path
) -> None:
    status, modules = imported_by(*argv, "--store", sqlite_url, cwd=tmp_path)
    assert status in (0, 1)  # 1: the absent record, as asked
    assert modules & (SDK | NOT_FOR_SQLITE) == set()


#: On Redis, the commands whose reading differs (the listing, one record, the histories).
ON_REDIS = [["keys", "list"], ["keys", "show", ABSENT], ["audit", "verify"]]


@pytest.mark.parametrize("argv", ON_REDIS, ids=" ".join)
def test_operator_commands_on_redis_load_no_sdk(
    argv: list[str], redis_url: str, tmp_path: Path
) -> None:
    status, modules = imported_by(*argv, "--store", redis_url, cwd=tmp_path)
    assert status in (0, 1)
    assert modules & SDK == set()


def test_the_commands_that_talk_mcp_load_it(sqlite_url: str, tmp_path: Path) -> None:
    """Not vacuous: the same report sees the SDK where a command needs it (a settle that stores
    a result builds the SDK's `CallToolResult`)."""
    argv = ["keys", "settle", ABSENT, "--result-text", "done", "--store", sqlite_url]
    status, modules = imported_by(*argv, cwd=tmp_path)
    assert status == 1  # no such record: nothing settled
    assert {"mcp_types", "pydantic"} <= modules


#: Reports the order in which the process started children and imported the heavy packages:
#: Python's audit events, raised by the interpreter itself (`subprocess.Popen` is how both the
#: SDK and an early start spawn on POSIX), so the order cannot be staged by the code under test.
_ORDER = """
import json, sys
events = []
def hook(event, args):
    if event == "import" and args[0] in ("fastmcp", "mcp", "pydantic"):
        if ["import", args[0]] not in events:
            events.append(["import", args[0]])
    elif event == "subprocess.Popen":
        events.append(["spawn", [str(word) for word in args[1]]])
sys.addaudithook(hook)
from mcp_once._cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exc:
    status = exc.code
print(json.dumps({"status": status, "events": events}))
"""

#: The upstream: an SDK server over stdio (what a Python upstream costs to start).
UPSTREAM = [sys.executable, str(Path(__file__).parents[2] / "benchmarks" / "_hop_upstream.py")]


def proxy_events(*argv: str, cwd: Path) -> tuple[object, list[list[Any]], str]:
    """`mcp-once proxy *argv` with its stdin at its end (it lists the upstream, then stops), in a
    state folder of its own: its exit status, the order of its spawns and imports, and what it
    (and its child) wrote to stderr."""
    env = {**os.environ, "XDG_STATE_HOME": str(cwd / "state")}
    done = subprocess.run(
        [sys.executable, "-c", _ORDER, "proxy", *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["status"], report["events"], done.stderr


def test_the_proxy_starts_its_stdio_upstream_before_importing_fastmcp(tmp_path: Path) -> None:
    """Issue 46, item 3: the child starts first and starts up while the proxy imports FastMCP
    (about a second), and the proxy's link adopts it: one child, not a second one started once
    FastMCP is in."""
    status, events, _ = proxy_events("--store", "memory://", "--", *UPSTREAM, cwd=tmp_path)
    assert status == 0
    spawns = [index for index, (kind, what) in enumerate(events) if kind == "spawn"]
    assert [events[index][1] for index in spawns] == [UPSTREAM]  # adopted: started once
    first_heavy = min(index for index, (kind, _) in enumerate(events) if kind == "import")
    assert spawns[0] < first_heavy, events


@pytest.mark.slow
def test_a_child_started_early_is_stopped_when_the_proxy_refuses_its_policy(
    tmp_path: Path,
) -> None:
    """Bad input found after the early start (a policy that does not parse) still exits 2, and
    takes the child it started with it: none is left running."""
    policy = tmp_path / "policy.toml"
    policy.write_text("[tools.\n")
    pid_file = tmp_path / "child.pid"
    # A child that ignores its stdin (so only a kill stops it), saying who it is first.
    child = ["sh", "-c", f'echo $$ > "{pid_file}"; exec sleep 60']
    status, events, _ = proxy_events(
        "--store", "memory://", "--policy", str(policy), "--", *child, cwd=tmp_path
    )
    assert status == EXIT_USAGE
    assert [what for kind, what in events if kind == "spawn"] == [child]
    if pid_file.exists():  # else it was stopped before its first line
        pid = int(pid_file.read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.slow
def test_an_early_child_that_exits_before_its_handshake_stops_the_proxy_naming_it(
    tmp_path: Path,
) -> None:
    """Adopted or not, a child that exits before answering is the same bad input as before:
    exit 2, one line naming the command, the child's own stderr passed through."""
    child = ["sh", "-c", "echo the upstream says why >&2; exit 3"]
    status, events, stderr = proxy_events("--store", "memory://", "--", *child, cwd=tmp_path)
    assert status == EXIT_USAGE
    assert events[0] == ["spawn", child]  # started early, before FastMCP
    assert "the upstream says why" in stderr
    assert "mcp-once: the upstream command 'sh' could not be started" in stderr


#: Writes to the file its first argument names the modules the process had imported when it
#: started its first child (the audit event, raised by the interpreter) and when it exited: the
#: proxy's stdout is the MCP channel here, so the report cannot go there.
_BUDGET = """
import atexit, json, sys
report = sys.argv.pop(1)
at_spawn = []
def hook(event, args):
    if event == "subprocess.Popen" and not at_spawn:
        at_spawn.append(sorted(sys.modules))
sys.addaudithook(hook)
def write():
    with open(report, "w") as f:
        json.dump({"spawn": at_spawn[0] if at_spawn else None, "exit": sorted(sys.modules)}, f)
atexit.register(write)
from mcp_once._cli import main
sys.exit(main(sys.argv[1:]))
"""

#: Imported before a stdio upstream's child is started: none of these (the store, the client
#: library, the SDK), only what reads the command line.
NOT_BEFORE_THE_SPAWN = {"idempotency", "orchestrator"} | SDK | NOT_FOR_SQLITE
#: Never imported by a stdio proxy on a memory store that serves its first listing: the front's
#: token verifiers (and the JOSE library's JWT/JWE under them), the policy file's reader and its
#: typo hints, the result-schema check (at the first check), redis-py and the OpenTelemetry SDK,
#: the other commands' modules and `tools`' report.
NOT_BEFORE_THE_FIRST_LISTING = {
    "fastmcp.server.auth.providers.jwt",
    "joserfc.jwt",
    "joserfc.jwe",
    "tomllib",
    "difflib",
    "jsonschema",
    "redis",
    "opentelemetry.sdk",
    "mcp_once.proxy.report",
    "mcp_once._cli._demo",
    "mcp_once._cli._keys",
    "mcp_once._cli._audit",
    "mcp_once._cli._runs",
    "mcp_once._cli._bench",
    "mcp_once._cli._wrap",
}


@pytest.mark.anyio
async def test_the_proxy_imports_only_what_its_first_listing_needs(tmp_path: Path) -> None:
    """Issue 46, item 3: before the child is started, only the command line is read (the store
    and the SDK are imported while the child starts); and a stdio proxy that answers a real
    client's `initialize` and first `tools/list` never imports what that does not need. The
    modules at exit hold every one imported before the listing, so "not at exit" is "not
    before the first listing" too."""
    report = tmp_path / "modules.json"
    proxy = StdioServerParameters(
        command=sys.executable,
        args=["-c", _BUDGET, str(report), "proxy", "--store", "memory://", "--", *UPSTREAM],
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
        cwd=str(tmp_path),
    )
    async with Client(proxy) as client:
        listed = await client.list_tools()
    # The client's exit waits for the proxy's: its report is written by then.
    assert {tool.name for tool in listed.tools} == {"read", "write"}  # served, through the proxy
    modules = json.loads(report.read_text())
    at_spawn = {name.split(".")[0] for name in modules["spawn"]}
    assert at_spawn & NOT_BEFORE_THE_SPAWN == set()
    assert "mcp_once._upstream.early" in modules["spawn"]  # not vacuous: the early start
    at_exit = set(modules["exit"])
    assert {"fastmcp", "idempotency.fastmcp", "mcp_once.proxy.server"} <= at_exit  # it served
    assert at_exit & NOT_BEFORE_THE_FIRST_LISTING == set()
