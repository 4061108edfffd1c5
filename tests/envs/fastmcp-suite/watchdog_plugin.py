"""pytest plugin: end a pytest-xdist worker whose test outlives pytest-timeout by far.

pytest-timeout's signal method raises its `Failed` wherever the main thread is; inside an
asyncio event loop that can land in some other task, which swallows it, and the test then hangs
for good (seen with the guard on). With `MCP_ONCE_HARD_TIMEOUT=<seconds>` each test run in an
xdist worker gets a timer: if the test is still running when it fires, the plugin writes the
test id and every thread's stack to `$MCP_ONCE_WATCHDOG_DIR/<pid>.txt` and ends the worker with
`os._exit`, so xdist reports "worker 'gwN' crashed while running '<test id>'" (an error for that
test) and starts a fresh worker for the rest. It does nothing outside xdist workers, so run.py
runs every phase under xdist (`-n 1` for the serial ones).
"""

from __future__ import annotations

import faulthandler
import os
import threading
import time
from collections.abc import Generator
from pathlib import Path

import pytest

HARD_TIMEOUT_ENV = "MCP_ONCE_HARD_TIMEOUT"
WATCHDOG_DIR_ENV = "MCP_ONCE_WATCHDOG_DIR"


def _end_worker(nodeid: str, seconds: float) -> None:
    folder = os.environ.get(WATCHDOG_DIR_ENV)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with (Path(folder) / f"{os.getpid()}.txt").open("w", encoding="utf-8") as out:
            out.write(f"{nodeid}\n{seconds:g}\n{time.time():.0f}\n")
            out.flush()
            faulthandler.dump_traceback(file=out, all_threads=True)
    os._exit(70)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    seconds = float(os.environ.get(HARD_TIMEOUT_ENV) or 0)
    if seconds <= 0 or not hasattr(item.config, "workerinput"):
        yield
        return
    timer = threading.Timer(seconds, _end_worker, args=(item.nodeid, seconds))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
