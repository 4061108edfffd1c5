"""How `mcp-once proxy` (stdio front, stdio upstream) ends: on stdin EOF, soon after its upstream
exits; on SIGTERM or SIGINT, its upstream stopped first; and a desktop client's own stop (the MCP
SDK's: stdin closed, 2 s, SIGTERM, 2 s, SIGKILL) leaves no upstream behind, even one that does
not exit on EOF (slow tier: real processes, each a fresh interpreter).

The upstream is a Python SDK server (`exit_server.py`) that writes its pid, so whether it still
runs is checked by pid, at the moment the proxy is gone: nothing is given time to settle.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest
from mcp import StdioServerParameters
from mcp.client import Client
from proxy_kit import initialize_request

SERVER = Path(__file__).with_name("exit_server.py")
#: The longest any wait here lasts before the test fails (a proxy that does not exit at all).
DEADLINE = 20.0
#: Seconds from the upstream's exit to the proxy's, on stdin EOF: what fails on main. What is left
#: once the child is reaped is closing the store and leaving: 0.015-0.05 s measured on a loaded
#: 2-core machine (load 9); main spent 0.45-1.3 s there, in the interpreter's teardown (~130,000
#: objects, 1,500 modules), 0.40 s at the least on a quiet machine: this bound is below that.
AFTER_UPSTREAM = 0.3
#: Seconds from stdin EOF to the proxy's exit with an upstream that exits on EOF: measured
#: 0.43-1.2 s (main 0.7-3.0 s, the upstream alone 0.4-0.9 s), under the 2 s a desktop client
#: waits before its SIGTERM. The bound is looser than those 2 s since most of it is the
#: upstream's own exit, which a whole test run under load stretches; the bound above is ours.
ON_EOF = 5.0


def proxy(pid_file: Path, *upstream_flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mcp_once",
        "proxy",
        "--store",
        "memory://",
        "--",
        sys.executable,
        str(SERVER),
        str(pid_file),
        *upstream_flags,
    ]


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, IndexError):
            return False
    return True


def _send(stdin: IO[bytes], message: dict[str, Any]) -> None:
    stdin.write((json.dumps(message) + "\n").encode())
    stdin.flush()


@contextmanager
def serving(tmp_path: Path, *upstream_flags: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The proxy, its upstream listed once (so the child runs and is adopted), and the child's
    pid; killed at the end if a test left it running."""
    pid_file = tmp_path / "upstream.pid"
    process = subprocess.Popen(
        proxy(pid_file, *upstream_flags),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        _send(process.stdin, initialize_request("exit-test"))
        assert json.loads(process.stdout.readline())["id"] == 1
        _send(process.stdin, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _send(process.stdin, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        listed = json.loads(process.stdout.readline())
        assert [t["name"] for t in listed["result"]["tools"]] == ["echo"]
        child = int(pid_file.read_text())
        assert running(child)
        yield process, child
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        child_pid = pid_file.read_text() if pid_file.exists() else ""
        if child_pid and running(int(child_pid)):
            os.killpg(int(child_pid), signal.SIGKILL)


def test_the_proxy_exits_on_eof_right_after_its_upstream(tmp_path: Path) -> None:
    with serving(tmp_path) as (process, child):
        assert process.stdin is not None
        process.stdin.close()
        closed = time.monotonic()
        child_gone = proxy_gone = None
        while proxy_gone is None and time.monotonic() - closed < DEADLINE:
            now = time.monotonic()
            if child_gone is None and not running(child):
                child_gone = now
            if process.poll() is not None:
                proxy_gone = now
            time.sleep(0.005)  # polling both pids: the resolution of the measurement
        assert proxy_gone is not None, "the proxy did not exit after its stdin closed"
        assert process.returncode == 0
        assert child_gone is not None and child_gone <= proxy_gone
        assert proxy_gone - child_gone < AFTER_UPSTREAM, (
            f"the proxy exited {proxy_gone - child_gone:.2f} s after its upstream"
        )
        assert proxy_gone - closed < ON_EOF, f"the proxy took {proxy_gone - closed:.2f} s"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signal_stops_the_upstream_before_the_proxy_exits(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """With the client still connected (stdin open) and an upstream that ignores EOF: the signal
    reaches the proxy alone (the upstream runs in a session of its own), and the proxy stops it."""
    with serving(tmp_path, "--ignore-eof") as (process, child):
        process.send_signal(signum)
        process.wait(DEADLINE)
        assert not running(child), "the proxy exited and left its upstream running"
        assert process.returncode == 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_desktop_clients_stop_leaves_no_upstream_behind(tmp_path: Path) -> None:
    """The MCP SDK's client stops the proxy as a desktop client does: stdin closed, 2 s, SIGTERM
    to its process group, 2 s, SIGKILL. The upstream ignores EOF, so the proxy is still waiting
    for it when the SIGTERM comes: the proxy stops it then, before it exits."""
    pid_file = tmp_path / "upstream.pid"
    argv = proxy(pid_file, "--ignore-eof")
    async with Client(StdioServerParameters(command=argv[0], args=argv[1:])) as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["echo"]
        child = int(pid_file.read_text())
    try:
        assert not running(child), "the proxy's upstream was left running after the client's stop"
    finally:
        if running(child):
            os.killpg(child, signal.SIGKILL)
