"""Every chaos test retries without backoff sleeps (attempts, limits and timeouts unchanged)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import orchestrator


@pytest.fixture(autouse=True)
def no_backoff_sleeps() -> Iterator[None]:
    with orchestrator.testing():
        yield
