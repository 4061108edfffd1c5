"""The event loop a call runs on, and background tasks that belong to that loop, not to a request.

Some work serves every request of an event loop at once: the guard's lease renewals
(`_guard/lease.py`), the reader of a Redis connection under trio (`_stores/redis/transport.py`).
Started from inside whichever request needed it first, such a task must neither hold up that
request's task group nor die with it, and must not inherit its context variables (the current
span, the current claim). So it runs as a system task: on asyncio a task of the loop in a fresh
context, held here because asyncio keeps only weak references to running tasks; on trio
`spawn_system_task`. Either way it is cancelled when the event loop shuts down.

It sits at the top of the package, beside neither side: the guard and the stores both use it,
and the stores import nothing from the guard.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from typing import Any

#: Running asyncio system tasks, held so the loop's weak references cannot drop them mid-run.
_running: set[asyncio.Task[None]] = set()


def current_loop() -> object:
    """The running event loop's identity: an asyncio loop, or a trio run's token."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        import trio

        return trio.lowlevel.current_trio_token()


def loop_time() -> float:
    """The running event loop's clock: what `anyio.current_time()` answers (an asyncio loop's
    `time()`, trio's `current_time()`), without anyio's per-call look-up of the running library
    (seven Python calls each time; the guard reads the clock several times per call)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        import trio

        return trio.current_time()


def loop_alive(loop: object) -> bool:
    """Whether `loop` (from `current_loop`) can still run anything."""
    if isinstance(loop, asyncio.AbstractEventLoop):
        return not loop.is_closed()
    import trio

    assert isinstance(loop, trio.lowlevel.TrioToken)
    try:
        loop.run_sync_soon(_nothing)
    except trio.RunFinishedError:
        return False
    return True


def _nothing() -> None:
    pass


def spawn(run: Callable[[], Coroutine[Any, Any, None]], *, name: str) -> object:
    """Start `run()` as a system task of the current event loop; returns its task handle."""
    loop = current_loop()
    context = contextvars.Context()
    if isinstance(loop, asyncio.AbstractEventLoop):
        task = loop.create_task(run(), name=name, context=context)
        _running.add(task)
        task.add_done_callback(_running.discard)
        return task
    import trio

    return trio.lowlevel.spawn_system_task(run, name=name, context=context)


def cancelled_beyond(scope: Any) -> bool:
    """Whether a cancel scope enclosing `scope` (an entered `anyio.CancelScope`, shielded) has
    been cancelled: the request that `scope` shields gave up while it ran.

    A shield hides exactly this from the code inside it, and anyio has no public way to ask,
    so this reads the backend's own structures: on asyncio anyio's parent-scope chain, on trio
    the task's cancel statuses. A scope further out that shields in its turn ends the search (a
    cancellation beyond it reaches nobody here). Whatever the structures do not answer reads as
    False: the caller then learns of the cancellation at its next checkpoint, later but surely.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _trio_cancelled_beyond(scope)
    parent = getattr(scope, "_parent_scope", None)
    while parent is not None:
        if getattr(parent, "_cancel_called", False) is True:
            return True
        if getattr(parent, "_shield", False) is True:
            return False
        parent = getattr(parent, "_parent_scope", None)
    return False


def _trio_cancelled_beyond(scope: Any) -> bool:
    import trio

    original = getattr(scope, "_CancelScope__original", None)
    status = getattr(trio.lowlevel.current_task(), "_cancel_status", None)
    while status is not None and getattr(status, "_scope", None) is not original:
        status = getattr(status, "_parent", None)
    if status is None:
        return False
    status = getattr(status, "_parent", None)
    while status is not None:
        outer = getattr(status, "_scope", None)
        if getattr(outer, "cancel_called", False) is True:
            return True
        if getattr(outer, "shield", False) is True:
            return False
        status = getattr(status, "_parent", None)
    return False
