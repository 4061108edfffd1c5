"""Closed-loop throughput: N callers, each issuing its next request when the last one returns.

Every contender is driven the same way: callers warm up (connections open, scripts cached), then
all start together, run for a fixed window and count finished operations; the rate divides by the
time until the last caller stopped, so work still in flight at the deadline is neither lost nor
free.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Awaitable, Callable

import anyio

WARMUP_OPS = 3


async def async_rate(
    concurrency: int, duration: float, op: Callable[[int], Awaitable[object]]
) -> float:
    """Operations per second of `concurrency` tasks calling `op(n)` (n unique per call)."""
    numbers = itertools.count()
    ready = 0
    all_ready = anyio.Event()
    go = anyio.Event()
    done = 0
    window: list[float] = []

    async def caller() -> None:
        nonlocal ready, done
        for _ in range(WARMUP_OPS):
            await op(next(numbers))
        ready += 1
        if ready == concurrency:
            all_ready.set()
        await go.wait()
        deadline = window[0] + duration
        while time.perf_counter() < deadline:
            await op(next(numbers))
            done += 1

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(caller)
        await all_ready.wait()
        window.append(time.perf_counter())
        go.set()
    return done / (time.perf_counter() - window[0])


def thread_rate(concurrency: int, duration: float, op: Callable[[int], object]) -> float:
    """Operations per second of `concurrency` threads calling `op(n)` (n unique per call)."""
    numbers = itertools.count()
    lock = threading.Lock()
    window: list[float] = []
    barrier = threading.Barrier(concurrency, action=lambda: window.append(time.perf_counter()))
    counts = [0] * concurrency
    errors: list[BaseException] = []

    def next_number() -> int:
        with lock:
            return next(numbers)

    def caller(index: int) -> None:
        try:
            for _ in range(WARMUP_OPS):
                op(next_number())
            barrier.wait()
            deadline = window[0] + duration
            while time.perf_counter() < deadline:
                op(next_number())
                counts[index] += 1
        except BaseException as exc:  # reported to the caller below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.perf_counter() - window[0])
