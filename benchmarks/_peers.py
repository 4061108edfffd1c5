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

from . import _redis

#: Each peer's pinned version.
PEERS = {"supergateway": "4.0.0", "mcp-proxy": "0.13.0"}


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


def install_peers() -> Peers:
    """Install the pinned peers (once per pin) and say how to start them."""
    assert _redis.REPO  # its import put tests/ on sys.path, where npm_install lives
    from npm_install import npm_install  # type: ignore[import-not-found]

    node = shutil.which("node")
    uv = shutil.which("uv")
    if node is None or uv is None:
        _fail("node and uv must be on PATH")
    npm = _cache() / "npm"
    npm_install(npm, [f"supergateway@{PEERS['supergateway']}"], _fail)
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
