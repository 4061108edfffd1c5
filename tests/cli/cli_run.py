"""Running `mcp-once` in-process for the CLI tests, and the private Redis they read.

`main([...])` runs in a worker thread (the CLI runs its own event loop); a `SystemExit` is its
exit code, as the shell would see it.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import pytest
from redis_server import RedisServer, redis_server_binary

from mcp_once._cli import main

UNDER_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def _cli_in_thread(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Ran:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return Ran(code, out, err)


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> Ran:
    """`mcp-once *argv` in-process (a worker thread: the CLI runs its own event loop)."""
    return await anyio.to_thread.run_sync(functools.partial(_cli_in_thread, capsys, list(argv)))


def sync_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> Ran:
    return _cli_in_thread(capsys, list(argv))


def private_redis_server(what: str) -> Iterator[RedisServer]:
    """A Redis of the calling module's own (the CLI takes no key prefix, so each test empties
    it); skipped loudly without redis-server, a failure under CI."""
    if redis_server_binary() is None:
        message = f"REDIS NOT AVAILABLE — the Redis half of the {what} tests cannot run"
        if UNDER_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with RedisServer() as server:
        yield server
