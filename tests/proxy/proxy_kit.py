"""What the proxy tests share: the upstream command lines, the ledger's counts, the proxy as a
process, and the answers' markers."""

from __future__ import annotations

import hashlib
import inspect
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_types import CallToolResult

HERE = Path(__file__).parent
LEDGER_SERVER = HERE / "ledger_server.mjs"
TAP = HERE / "tap.py"
#: The conformance suites' fixture server (run `--unguarded` as an upstream).
FIXTURE = HERE.parent / "conformance" / "fixture_server.py"
MARKER = "io.github.mcp-once/idempotency"
KEY = "io.github.mcp-once/idempotency-key"


def initialize_request(client: str = "t") -> dict[str, Any]:
    """A 2025-era `initialize` request (id 1) as raw JSON-RPC, for a test that speaks the wire."""
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": client, "version": "1"},
        },
    }


@dataclass(frozen=True)
class NodeServers:
    node: str
    prefix: Path

    def ledger(self, ledger: Path, *http: str) -> list[str]:
        """The ledger server's command line (stdio; `"--port", "0"` for HTTP)."""
        return [self.node, str(LEDGER_SERVER), str(self.prefix), str(ledger), *http]

    def memory(self) -> list[str]:
        """The npm reference server `@modelcontextprotocol/server-memory`."""
        return self.reference("server-memory")

    def reference(self, package: str, *args: str) -> list[str]:
        """An npm reference server `@modelcontextprotocol/<package>` (stdio), with `args`."""
        entry = self.prefix / "node_modules/@modelcontextprotocol" / package / "dist/index.js"
        return [self.node, str(entry), *args]


def tapped(count_file: Path, command: list[str], *, arguments: bool = False) -> list[str]:
    """`command` behind a tap counting the `tools/call` requests it is sent (with `arguments`,
    each request's tool name and arguments as a JSON line)."""
    flag = ["--arguments"] if arguments else []
    return [sys.executable, str(TAP), *flag, str(count_file), "--", *command]


def lines(path: Path) -> int:
    """Lines in a ledger file (0 when it does not exist yet)."""
    return len(path.read_text().splitlines()) if path.exists() else 0


def proxy_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "mcp_once", "proxy", *args]


def status(result: CallToolResult) -> str | None:
    """`executed` or `replayed` from the guard's marker; None when the call was not guarded."""
    marker = (result.meta or {}).get(MARKER)
    return marker.get("status") if isinstance(marker, dict) else None


def text(result: CallToolResult) -> str:
    first = result.content[0]
    return str(getattr(first, "text", ""))


@contextmanager
def announced(command: list[str], prefix: str, *, stream: str = "stderr") -> Iterator[str]:
    """Run `command` until the block ends; yield the rest of the first line starting with
    `prefix` on its `stream` (its address: the process prints it once it listens)."""
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    try:
        out = process.stderr if stream == "stderr" else process.stdout
        assert out is not None
        for line in out:
            if line.startswith(prefix):
                yield line.removeprefix(prefix).strip()
                break
        else:
            raise RuntimeError(f"{command[:4]} exited before announcing {prefix!r}")
    finally:
        process.kill()
        process.wait(timeout=30)


def source_hashes(owners: dict[str, Any], names: Iterable[str]) -> dict[str, str]:
    """sha256 of each `Owner.method`'s source (`owners` by name): what a pin of copied upstream
    code compares, so an upgrade that changes the code fails the pin."""
    found = {}
    for name in names:
        owner, method = name.split(".")
        source = inspect.getsource(getattr(owners[owner], method))
        found[name] = hashlib.sha256(source.encode()).hexdigest()
    return found


def http_url(announcement: str) -> str:
    """`http://host:port/mcp` from the proxy's `... at URL (store: ...)` line."""
    return announcement.split()[0]


@contextmanager
def conformance_fixture() -> Iterator[str]:
    """The conformance fixture, unguarded, over HTTP: an upstream that logs, samples, completes
    and asks for input (the suites' own scenarios through the proxy run in .ci/conformance)."""
    command = [sys.executable, str(FIXTURE), "--port", "0", "--unguarded"]
    with announced(command, "conformance fixture at ", stream="stdout") as line:
        yield http_url(line)


@contextmanager
def proxied_fixture(store_url: str) -> Iterator[str]:
    """`mcp-once proxy --listen` on `store_url` in front of the conformance fixture: its URL."""
    with conformance_fixture() as upstream:
        command = proxy_command("--store", store_url, "--listen", "127.0.0.1:0")
        with announced([*command, "--upstream", upstream], "mcp-once proxy at ") as line:
            yield http_url(line)


def node_port_url(announcement: str) -> str:
    return f"http://127.0.0.1:{announcement}/mcp"


def meta_key(key: str) -> dict[str, Any]:
    return {KEY: key}


class InProcess:
    """A FastMCP client of an in-process proxy with the SDK client's `call_tool` shape (the
    SDK's `Client` cannot serve a FastMCP server in process)."""

    def __init__(self, server: Any) -> None:
        from fastmcp import Client

        self._client = Client(server)

    async def __aenter__(self) -> InProcess:
        await self._client.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._client.__aexit__(*exc_info)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> CallToolResult:
        return await self._client.call_tool_mcp(name, arguments, meta=meta)


def desktop_configs() -> list[dict[str, Any]]:
    """The `mcpServers` entries of docs/proxy.md's desktop-client snippets (each JSON block after
    a `<!-- proxy-config -->` comment)."""
    import json
    import re

    page = (HERE.parents[1] / "docs" / "proxy.md").read_text()
    blocks = re.findall(r"<!-- proxy-config -->\n```json\n(.*?)\n```", page, flags=re.S)
    return [entry for block in blocks for entry in json.loads(block)["mcpServers"].values()]
