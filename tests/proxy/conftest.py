"""Fixtures of the proxy tests: the npm packages (the TypeScript SDK our ledger server is written
with, the reference servers `server-memory`, `-everything` and `-filesystem`), installed once
under the pytest cache, and node; and `mcp-server-git` from the package index, synced once from
its own lock (`tests/envs/mcp-server-git`).

Without node or npm the real-process tests skip loudly; under CI (CI=true) that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "server"))  # server_kit.serve_http

from npm_install import npm_install
from proxy_kit import NodeServers
from unavailable import unavailable

PINS = {
    "@modelcontextprotocol/sdk": "1.32.2",
    "@modelcontextprotocol/server-memory": "2026.8.31",
    "@modelcontextprotocol/server-everything": "2026.8.31",
    "@modelcontextprotocol/server-filesystem": "2026.8.31",
}


def _unavailable(reason: str) -> NoReturn:
    unavailable(f"NODE NOT AVAILABLE — the proxy's upstream tests cannot run: {reason}", "node")


@pytest.fixture(scope="session")
def node_servers(request: pytest.FixtureRequest) -> NodeServers:
    node = shutil.which("node")
    if node is None:
        _unavailable("node is not on PATH")
    cache = getattr(request.config, "cache", None)
    home = (
        cache.mkdir("mcp-once-proxy-npm")
        if cache is not None
        else request.getfixturevalue("tmp_path_factory").mktemp("mcp-once-proxy-npm")
    )
    prefix = home / "npm"
    npm_install(prefix, [f"{name}@{version}" for name, version in PINS.items()], _unavailable)
    return NodeServers(node=node, prefix=prefix)


#: `mcp-server-git` from the package index, in an environment of its own (its own lock).
GIT_SERVER_ENV = Path(__file__).resolve().parents[1] / "envs" / "mcp-server-git"


@pytest.fixture(scope="session")
def git_server() -> Path:
    """The `mcp-server-git` command, synced from `tests/envs/mcp-server-git`'s lock once."""
    uv = shutil.which("uv")
    if uv is None:
        unavailable("UV NOT AVAILABLE — mcp-server-git cannot be installed", "uv")
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    done = subprocess.run(
        [uv, "sync", "--frozen", "--project", str(GIT_SERVER_ENV)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    command = GIT_SERVER_ENV / ".venv" / "bin" / "mcp-server-git"
    if done.returncode != 0 or not command.exists():
        unavailable(f"MCP-SERVER-GIT NOT INSTALLED: uv sync failed: {done.stderr[-2000:]}", "uv")
    return command
