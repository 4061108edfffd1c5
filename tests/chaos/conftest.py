"""The chaos suite's settings: seeds and sizes, scaled up by `MCP_ONCE_SOAK=1` for local soaks.

Default sizes keep the whole suite within a couple of minutes on 2 cores (CI runs it); a soak
runs many more seeds and calls (`MCP_ONCE_SOAK=1 uv run pytest -m chaos -s`, or
`python -m orchestrator.chaos.soak --seeds 50`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from orchestrator import testing

SOAK = os.environ.get("MCP_ONCE_SOAK", "").lower() in {"1", "true", "yes"}


def seeds(default: tuple[int, ...], soak: int) -> tuple[int, ...]:
    return tuple(range(1, soak + 1)) if SOAK else default


def calls(default: int, soak: int) -> int:
    return soak if SOAK else default


@pytest.fixture(autouse=True)
def no_backoff_sleeps() -> Iterator[None]:
    """Retries without their waits: attempts, limits and timeouts behave as in production."""
    with testing():
        yield
