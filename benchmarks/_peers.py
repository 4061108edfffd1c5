"""The bridges the proxy hop is compared with, pinned and installed by the benchmark itself.

`supergateway` from npm (with tests/npm_install.py, as the tests install npm packages) and
`mcp-proxy` from the package index into a virtual environment of its own (`uv venv` and `uv pip
install`: it pins an SDK of its own, which must not meet this project's), both in a cache folder
kept across runs (`$MCP_ONCE_BENCH_CACHE`, default ~/.cache/mcp-once-bench), each reinstalled only
when its pin changes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from . import _redis  # its import puts tests/ on sys.path, where npm_install lives

#: Each peer's pinned version.
PEERS = {"supergateway": "4.0.0", "mcp-proxy": "0.13.0"}
#: The TypeScript upstream (the tests' ledger server) and the SDK it runs on, as the tests pin it.
LEDGER_SERVER = _redis.REPO / "tests" / "proxy" / "ledger_server.mjs"
LEDGER_SDK = "@modelcontextprotocol/sdk@1.32.2"


@dataclass(frozen=True)
class Peers:
    """How to start each installed peer."""

    supergateway: list[str]
    mcp_proxy: str


def _cache() -> Path:
    default = Path.home() / ".cache" / "mcp-once-bench"
    return Path(os.environ.get("MCP_ONCE_BENCH_CACHE", default)) / "peers"


def _fail(reason: str) -> NoReturn:
    raise RuntimeError(f"the benchmark's peers could not be installed: {reason}")


def _npm(prefix: Path, package: str) -> None:
    """`package` installed into `prefix` as the tests install npm packages."""
    from npm_install import npm_install  # type: ignore[import-not-found]

    npm_install(prefix, [package], _fail)


def install_ledger() -> tuple[str, Path]:
    """node, and the folder the ledger server's SDK is installed in (once per pin)."""
    node = shutil.which("node")
    if node is None:
        _fail("node must be on PATH")
    prefix = _cache() / "npm-ledger"
    _npm(prefix, LEDGER_SDK)
    return node, prefix


def install_peers() -> Peers:
    """Install the pinned peers (once per pin) and say how to start them."""
    node = shutil.which("node")
    uv = shutil.which("uv")
    if node is None or uv is None:
        _fail("node and uv must be on PATH")
    npm = _cache() / "npm"
    _npm(npm, f"supergateway@{PEERS['supergateway']}")
    entry = npm / "node_modules" / "supergateway" / "dist" / "index.js"
    venv = _cache() / f"mcp-proxy-{PEERS['mcp-proxy']}"
    binary = venv / "bin" / "mcp-proxy"
    if not binary.exists():
        shutil.rmtree(venv, ignore_errors=True)
        for command in (
            [uv, "venv", "-q", str(venv)],
            [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
             f"mcp-proxy=={PEERS['mcp-proxy']}"],
        ):  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                _fail(f"{' '.join(command)}: {done.stderr[-2000:]}")
    return Peers(supergateway=[node, str(entry)], mcp_proxy=str(binary))
