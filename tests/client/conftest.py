"""Client-test fixtures: testing mode (no backoff sleeps) unless a test asks for real waits."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import orchestrator

sys.path.insert(0, str(Path(__file__).parent))

from _http_server import HttpServer
from _servers import Recorder, make_server


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


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def http(recorder: Recorder) -> Iterator[HttpServer]:
    """The test servers' tools over streamable HTTP, on a port of their own."""
    server = HttpServer(make_server(recorder))
    server.start()
    yield server
    server.stop()
