"""Client-test fixtures: testing mode (no backoff sleeps) unless a test asks for real waits."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import orchestrator

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def real_waits() -> None:
    """Request this fixture to sleep the backoff and retry-hint waits for real."""


@pytest.fixture(autouse=True)
def _no_sleeps(request: pytest.FixtureRequest) -> Iterator[None]:
    if "real_waits" in request.fixturenames:
        yield
        return
    with orchestrator.testing():
        yield
