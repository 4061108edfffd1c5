"""Where the workload's server runs, and the process-level faults each place allows.

An `Endpoint` makes fresh client transports to one logical server (in-process over memory
streams, a stdio child per connection, or an HTTP server process) and knows how to restart it
abruptly. The workload wraps every transport it makes in the run's `Chaos`, so wire faults and
process faults share one run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO

import anyio
import anyio.lowlevel
import anyio.to_thread
import httpx2
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.mcpserver import MCPServer

from mcp_once.scenarios._ledger import Ledger
from mcp_once.scenarios._process import ChildProcess, free_port
from orchestrator import streamable_http_transport
from orchestrator.chaos import ChaosTransport, in_memory_transport

if TYPE_CHECKING:
    from mcp.client._transport import Transport

__all__ = [
    "Endpoint",
    "Era",
    "HoldWhileDown",
    "HttpEndpoint",
    "MemoryEndpoint",
    "ServerProcess",
    "StdioEndpoint",
    "TransportName",
    "free_port",
    "server_command",
]

TransportName = Literal["memory", "stdio", "http"]
Era = Literal["modern", "legacy"]

_ROOT = Path(__file__).resolve().parents[2]
_START_TIMEOUT = 20.0


def server_command(
    transport: Literal["stdio", "http"],
    ledger: Ledger,
    store_url: str | None,
    *,
    port: int = 0,
    lease: float = 30.0,
    wait: float = 10.0,
    hold: float = 0.0,
    retention: float | None = None,
    reconcile: bool = False,
) -> list[str]:
    """The argv that runs the workload server in a process of its own."""
    argv = [
        sys.executable,
        "-m",
        "mcp_once.scenarios._server_main",
        "--transport",
        transport,
        "--ledger",
        str(ledger.path),
        "--lease",
        repr(lease),
        "--wait",
        repr(wait),
        "--hold",
        repr(hold),
    ]
    if store_url is not None:
        argv += ["--store", store_url]
    if retention is not None:
        argv += ["--retention", repr(retention)]
    if reconcile:
        argv.append("--reconcile")
    if transport == "http":
        argv += ["--port", str(port)]
    return argv


def _child_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key in ("PATH", "HOME", "LANG")}
    env["PYTHONPATH"] = str(_ROOT)
    return env


class Endpoint:
    """One logical server: fresh transports to it, and an abrupt restart."""

    transport: TransportName
    era: Era

    def __init__(self, era: Era) -> None:
        self.era = era
        self.links: list[ChaosTransport] = []
        #: Abrupt restarts so far (kill -9 or the in-process equivalent).
        self.restarts = 0

    def make(self) -> Transport:
        raise NotImplementedError

    def attach(self, link: ChaosTransport) -> None:
        self.links = [known for known in self.links if not known.closed]
        self.links.append(link)

    async def ready(self) -> None:
        """Return once a connection attempt can succeed (a restarting server is back)."""

    async def restart(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Stop whatever the endpoint started."""

    @property
    def client_mode(self) -> Literal["auto", "legacy"]:
        return "legacy" if self.era == "legacy" else "auto"

    def describe(self) -> str:
        return f"{self.transport}/{self.era}"


class MemoryEndpoint(Endpoint):
    """An in-process server over memory streams; a restart is a fresh server object (same store,
    same ledger) and every open link dying at once, as a crashed process would drop them."""

    transport: TransportName = "memory"

    def __init__(self, factory: Callable[[], MCPServer], era: Era = "modern") -> None:
        super().__init__(era)
        self._factory = factory
        self.server = factory()

    def make(self) -> Transport:
        return in_memory_transport(self.server)

    async def restart(self) -> None:
        self.restarts += 1
        self.server = self._factory()
        for link in self.links:
            link._die()
        await anyio.lowlevel.checkpoint()


class StdioEndpoint(Endpoint):
    """A stdio child per connection; a restart kills the newest child with SIGKILL (the next
    connection starts a new one)."""

    transport: TransportName = "stdio"

    def __init__(self, argv: list[str], ledger: Ledger, era: Era = "modern") -> None:
        super().__init__(era)
        self._argv = argv
        self._ledger = ledger
        self._errlog: TextIO | None = None

    def make(self) -> Transport:
        params = StdioServerParameters(
            command=self._argv[0], args=self._argv[1:], env=_child_env(), cwd=str(_ROOT)
        )
        if self._errlog is None:
            # The children's stderr goes next to the ledger, not into the caller's terminal.
            self._errlog = self._ledger.path.with_suffix(".server.log").open("a")
        return stdio_client(params, errlog=self._errlog)

    async def aclose(self) -> None:
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None

    def newest_pid(self) -> int | None:
        ups = self._ledger.events("server_up")
        return ups[-1][2] if ups else None

    async def restart(self) -> None:
        pid = self.newest_pid()
        if pid is None:
            return
        self.restarts += 1
        kill(pid, signal.SIGKILL)
        await anyio.lowlevel.checkpoint()


def kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class ServerProcess(ChildProcess):
    """A workload server process on a fixed port: start, kill -9, restart, pause, resume."""

    def __init__(
        self,
        argv_for_port: Callable[[int], list[str]],
        port: int | None = None,
        *,
        log: Path | None = None,
    ) -> None:
        self.port = port if port is not None else free_port()
        self._argv = argv_for_port(self.port)
        #: Where the server's own output goes (None: discarded).
        self.log = log
        super().__init__()
        #: Set while the server accepts connections.
        self.up = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> None:
        if self.log is None:
            self.proc = subprocess.Popen(
                self._argv,
                env=_child_env(),
                cwd=str(_ROOT),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        else:
            with self.log.open("ab") as sink:
                self.proc = subprocess.Popen(
                    self._argv,
                    env=_child_env(),
                    cwd=str(_ROOT),
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=sink,
                )
        deadline = time.monotonic() + _START_TIMEOUT
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the workload server exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"the workload server on port {self.port} did not start")
            time.sleep(0.02)  # a startup poll, not synchronisation of the code under test
        self.up.set()

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    stop_timeout = 5.0

    def _gone(self) -> None:
        self.up.clear()

    def restart(self) -> None:
        self.kill()
        self.start()

    async def wait_up(self) -> None:
        if not self.up.is_set():
            await anyio.to_thread.run_sync(self.up.wait, _START_TIMEOUT, abandon_on_cancel=True)


class HoldWhileDown(httpx2.AsyncBaseTransport):
    """Requests made while the server restarts wait until it is back, as behind a load balancer
    that queues them; without it a restart's cost in attempts depends on how fast it comes back.
    """

    def __init__(self, process: ServerProcess) -> None:
        self._process = process
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        await self._process.wait_up()
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class HttpEndpoint(Endpoint):
    """A streamable HTTP server process; a restart is kill -9 and a new process on the same port.
    Connections wait for the server to be back (as a client behind a load balancer would)."""

    transport: TransportName = "http"

    def __init__(self, process: ServerProcess, era: Era = "modern") -> None:
        super().__init__(era)
        self.process = process

    def make(self) -> Transport:
        return streamable_http_transport(self.process.url, inner=HoldWhileDown(self.process))

    async def ready(self) -> None:
        await self.process.wait_up()

    async def restart(self) -> None:
        self.restarts += 1
        await anyio.to_thread.run_sync(self.process.restart)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.process.stop)
