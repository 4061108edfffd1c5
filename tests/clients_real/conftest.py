"""Fixtures of the real-client tier: the servers (one HTTP process per flavor for the session;
stdio servers are started by the clients themselves) and the npm clients, installed once.

npm pins (installed at test time into a folder under the pytest cache, never globally):
- `@modelcontextprotocol/inspector` 2.12.0, the current Inspector (`npx
  @modelcontextprotocol/inspector` gets it; v1 is deprecated). It needs Node >= 22.19: where the
  machine's Node is older (Debian's machines here have 20), Node 22.23.5 is installed from the
  npm package `node-linux-<arch>` (a binary shipped inside a registry package) and runs only the
  Inspector.
- `@modelcontextprotocol/sdk` 1.32.2, the TypeScript SDK, run with the machine's Node.

Without node or npm, or when the install fails, the npm tests skip with a loud reason; under CI
(CI=true) that is a failure, as for Redis and nginx.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from npm_install import npm_install
from real_clients_kit import FLAVORS, NodeClients, Served, http_server, served_in
from unavailable import unavailable

PINS = {"@modelcontextprotocol/inspector": "2.12.0", "@modelcontextprotocol/sdk": "1.32.2"}
#: The Inspector's `engines.node`, and the Node it gets where the machine's is older.
INSPECTOR_NODE = (22, 19)
NODE_PIN = "22.23.5"


def _unavailable(reason: str) -> NoReturn:
    unavailable(
        f"NODE CLIENTS NOT AVAILABLE — npm-client tests cannot run: {reason}", "Node.js client"
    )


def _node_version(node: str) -> tuple[int, ...]:
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
    found = re.match(r"v(\d+)\.(\d+)", out.stdout.strip())
    if found is None:
        _unavailable(f"{node} --version printed {out.stdout!r}")
    return tuple(int(part) for part in found.groups())


@pytest.fixture(scope="session")
def node_clients(request: pytest.FixtureRequest) -> NodeClients:
    node = shutil.which("node")
    if node is None:
        _unavailable("node is not on PATH")
    packages = [f"{name}@{version}" for name, version in PINS.items()]
    old_node = _node_version(node) < INSPECTOR_NODE
    arch = {"x86_64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())
    node_package = f"node-linux-{arch}"
    if old_node:
        if arch is None or sys.platform != "linux":
            _unavailable(f"node {node} is older than the Inspector needs, and no Node package fits")
        packages.append(f"{node_package}@{NODE_PIN}")
    cache = getattr(request.config, "cache", None)  # None under `-p no:cacheprovider`
    home = (
        cache.mkdir("mcp-once-real-clients")
        if cache is not None
        else request.getfixturevalue("tmp_path_factory").mktemp("mcp-once-real-clients")
    )
    prefix = home / "npm"
    npm_install(prefix, packages, _unavailable)
    inspector_node = (
        str(prefix / "node_modules" / node_package / "bin" / "node") if old_node else node
    )
    return NodeClients(prefix=prefix, node=node, inspector_node=inspector_node)


@pytest.fixture(scope="session")
def served_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Served]:
    """One key store per flavor and one ledger, for the session."""
    root = tmp_path_factory.mktemp("real-clients")
    ledger = root / "ledger.sqlite3"
    return {f: Served(f, root / f"{f}-keys.sqlite3", ledger) for f in FLAVORS}


@pytest.fixture(scope="session")
def http_servers(served_files: dict[str, Served]) -> Iterator[dict[str, Served]]:
    """Both flavors served over streamable HTTP, each in a process of its own."""
    with http_server(served_files["mcpserver"]) as a, http_server(served_files["fastmcp"]) as b:
        yield {"mcpserver": a, "fastmcp": b}


@pytest.fixture(
    params=[(flavor, transport) for flavor in FLAVORS for transport in ("stdio", "http")],
    ids=lambda setting: "-".join(setting),
)
def served_setting(request: pytest.FixtureRequest) -> tuple[Served, bool]:
    """Each flavor over stdio and over HTTP: (the server, whether the client speaks HTTP)."""
    flavor, transport = request.param
    http = transport == "http"
    return served_in(request, flavor, http=http), http
