"""The leg's tests import the shared crash kit (tests/durable) and the example they reuse."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests" / "durable"), str(ROOT / "examples")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Temporal's SDK runs on asyncio only
