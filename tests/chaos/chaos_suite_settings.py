"""The chaos suite's sizes: seeds and calls, scaled up by `MCP_ONCE_SOAK=1` for local soaks.

Default sizes keep the whole suite within a couple of minutes on 2 cores (CI runs it); a soak
runs many more seeds and calls (`MCP_ONCE_SOAK=1 uv run pytest -m chaos -s`, or
`python -m mcp_once.scenarios.soak --seeds 50`).
"""

from __future__ import annotations

import os

SOAK = os.environ.get("MCP_ONCE_SOAK", "").lower() in {"1", "true", "yes"}


def seeds(default: tuple[int, ...], soak: int) -> tuple[int, ...]:
    return tuple(range(1, soak + 1)) if SOAK else default


def calls(default: int, soak: int) -> int:
    return soak if SOAK else default
