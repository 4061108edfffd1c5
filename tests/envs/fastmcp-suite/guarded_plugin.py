"""pytest plugin: every FastMCP server the tests build gets mcp-once's IdempotencyMiddleware.

    MCP_ONCE_GUARD=1 PYTHONPATH=tests/envs/fastmcp-suite python -m pytest -p guarded_plugin ...

With `MCP_ONCE_GUARD=1` it wraps `FastMCP.__init__` (see `boot/mcp_once_guard.py`) so that each
server, once built, gets `add_middleware(IdempotencyMiddleware(MemoryKeyStore()))`; without it
the plugin does nothing. `MCP_ONCE_GUARD_STATS=<dir>` makes each process write how many servers
it guarded to `<dir>/<pid>.count` at exit (run.py sums them, to show the guard was really on).

The plugin covers the pytest process and its xdist workers. Servers built in child interpreters
(stdio servers, `fastmcp run`, subprocess tests) are covered by the `.pth` file that run.py
writes into the suite's environment for its guarded run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

GUARD_ENV = "MCP_ONCE_GUARD"
STATS_ENV = "MCP_ONCE_GUARD_STATS"

_BOOT_DIR = str(Path(__file__).resolve().parent / "boot")
if _BOOT_DIR not in sys.path:
    sys.path.insert(0, _BOOT_DIR)

import mcp_once_guard  # noqa: E402  (found in boot/, put on the path just above)


def guard_enabled() -> bool:
    return os.environ.get(GUARD_ENV) == "1"


def pytest_configure(config: pytest.Config) -> None:
    if not guard_enabled():
        return
    mcp_once_guard.set_stats_dir(os.environ.get(STATS_ENV), role="pytest")
    mcp_once_guard.install()


def pytest_report_header(config: pytest.Config) -> str:
    if guard_enabled():
        return (
            "mcp-once guard: ON, FastMCP(...) then "
            "add_middleware(IdempotencyMiddleware(MemoryKeyStore())) on every server"
        )
    return f"mcp-once guard: off ({GUARD_ENV} is not 1)"
