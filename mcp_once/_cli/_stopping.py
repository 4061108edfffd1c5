"""How a `mcp-once proxy` process with a stdio front stops: on stdin EOF, SIGTERM or SIGINT, its
upstream children stopped and its stores closed, then at once (docs/proxy.md, "Stopping").

Why it matters: a desktop client (the MCP SDK's `stdio_client`) closes the proxy's stdin, waits
2 s, then SIGTERMs it and 2 s later SIGKILLs it. Measured on a loaded 2-core machine (issue 46),
the proxy took 1.4-3 s from EOF: the upstream's own exit (0.3-0.9 s, which the proxy must wait
for, or leave it behind), then 0.6-1.3 s of the interpreter's teardown (~130,000 objects and
1,500 modules freed one by one after `main` returned). So the client usually SIGTERMed it, and a
SIGTERM killed it outright: its stdio child, in a session of its own, was left to notice EOF by
itself, and one that does not was left behind for good.

- `exit_now`: once a served run has ended (children reaped, stores closed), the console script
  exits without the teardown: logging shut down, stdout and stderr flushed, atexit handlers run,
  non-daemon threads joined (bounded), then `os._exit`. Nothing left to free is ours to free.
- `until_stopped`: SIGTERM and SIGINT stop the run as a cancellation (each child's process group
  SIGTERMed at once, `early.stop_children`), so the same clean stop runs; if the run has not
  ended `SIGNAL_GRACE` s later (the SDK's stdio front reads stdin in a worker thread, which no
  cancellation interrupts, until a line or EOF comes), the children are SIGKILLed, the stores
  closed from here (within `CLOSE_GRACE`), and the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable

import anyio

from mcp_once._upstream.early import stop_children

#: Seconds from a stop signal to the fallback when the run does not end by itself (with
#: `CLOSE_GRACE`: under the 2 s a desktop client waits between its SIGTERM and its SIGKILL).
SIGNAL_GRACE = 1.0
#: The longest the stores of a run that did not end get to close before the exit.
CLOSE_GRACE = 0.5
#: The longest `exit_now` waits for a non-daemon thread still running.
THREAD_GRACE = 1.0

#: Whether a served run has ended in this process (the console script then exits with `exit_now`).
served = False


def exit_now(status: int, *, join: bool = True) -> None:
    """End the process with `status` now, skipping the interpreter's teardown (see above);
    `join`: wait for non-daemon threads first (not for a run that did not end: the thread
    reading stdin is one)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    atexit._run_exitfuncs()
    deadline = time.monotonic() + THREAD_GRACE
    for thread in threading.enumerate() if join else []:
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    os._exit(status)


async def until_stopped(
    run: Callable[[], Awaitable[None]], close: Callable[[], Awaitable[None]]
) -> None:
    """`run()`, stopped as described above by SIGTERM or SIGINT (on POSIX; elsewhere just run);
    `close()` closes its stores where the run does not end in time."""
    if sys.platform == "win32":  # pragma: no cover - no signal receivers on Windows
        await run()
        return
    try:
        await _watched(run, close)
    except BaseExceptionGroup as group:
        # What the run raised (SystemExit from `fail`, an error), as it would without the watch.
        if len(group.exceptions) == 1:
            error = group.exceptions[0]
            raise error from error.__cause__
        raise


async def _watched(
    run: Callable[[], Awaitable[None]], close: Callable[[], Awaitable[None]]
) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with anyio.create_task_group() as watching:
            running = anyio.CancelScope()

            async def watch() -> None:
                async for _ in signals:
                    stop_children(signal.SIGTERM)
                    running.cancel()
                    await anyio.sleep(SIGNAL_GRACE)
                    stop_children(signal.SIGKILL)
                    with anyio.move_on_after(CLOSE_GRACE, shield=True):
                        await close()
                    exit_now(0, join=False)

            watching.start_soon(watch)
            with running:
                await run()
            watching.cancel_scope.cancel()
