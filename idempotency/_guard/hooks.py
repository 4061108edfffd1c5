"""`on_replay`: the server's hook, called each time a guarded call is answered from its record.

What the hook gets is what an operator may count or alert on, never the caller's data: the tool,
how old the answer is, how many executions the record has seen and where the key came from. Not
the key (it names a tenant's call), the arguments or the result.

A hook never breaks a call: it runs inline after the answer is settled, and an exception from it
is logged (its type only, at WARNING on the `idempotency` logger) and swallowed. Keep it quick:
it runs on the request's path; hand slow work to a queue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..wire import run_hook
from .telemetry import logger


@dataclass(frozen=True, slots=True)
class Replay:
    """One replayed call, as `on_replay` sees it."""

    #: The tool's name as records know it.
    tool: str
    #: Seconds since the replayed answer was produced (its first execution finished).
    age: float
    #: Executions the record has seen (1 unless an expired lease was taken over).
    executions: int
    #: Where the key came from: "client" (sent with the call) or "derived" (made by the server
    #: for a keyless call).
    key_source: str


ReplayHook = Callable[[Replay], object]


def replayed(hook: ReplayHook | None, event: Replay) -> None:
    """Call `on_replay` the way both sides run hooks (`wire.run_hook`)."""
    run_hook(logger, "on_replay", hook, event)
