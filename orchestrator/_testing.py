"""Testing mode: retries without the waits, so test suites stay fast (like `stamina.set_testing`).

Only the sleeps go: attempts, limits, budgets, deadlines and timeouts behave as in production, and
reports still record the waits that would have been slept.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import anyio.lowlevel

_lock = threading.Lock()
_depth = 0


@contextmanager
def testing() -> Iterator[None]:
    """Within this block (process-wide, nestable), backoff and retry-hint waits are not slept."""
    global _depth
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1


def is_testing() -> bool:
    return _depth > 0


async def pause(seconds: float) -> None:
    """Wait `seconds` (cancellable); under `testing()` only yield to the scheduler."""
    if seconds <= 0 or is_testing():
        await anyio.lowlevel.checkpoint()
    else:
        await anyio.sleep(seconds)
