"""`current_claim()`: the running call's claim, for a tool that fences its own downstream writes.

The record's fence stops a stale worker from overwriting the *record*; it cannot stop the tool's
own effect. A worker paused past its lease (a GC pause, SIGSTOP, a VM migration) resumes in the
middle of its tool and finishes the step it was in before cancellation can reach it (cancellation
lands only at the tool's next `await`; a sync tool in a worker thread cannot be cancelled at all).
If the record was taken over meanwhile, or settled by an operator and run again, that step runs
twice. Only the system the tool writes to can refuse the stale write, and only if it is told the
fence: so the guard publishes the claim to the tool (rule 13).

A context variable rather than a tool parameter: it works the same under `@idempotent`,
`install()` and the low-level handler, needs no change to the tool's signature (so none to its
input schema), and is copied into worker threads (`anyio.to_thread.run_sync`) and child tasks.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Claim:
    """The claim a guarded tool runs under (`current_claim()`)."""

    #: The idempotency key, as the client sent it or as the server derived it: what the result
    #: `_meta` reports. Unique only within its scope (tenant and server) and tool.
    key: str
    #: The record's fence number: strictly increasing per record, so a write stamped with it can
    #: be refused once a later execution of the same record wrote with a higher one. It restarts
    #: at 1 only when the record itself is forgotten (after its retention).
    fence: int
    #: How many executions the record has seen, this one included (1 on a first run; more after
    #: a takeover, or after a claim that was released or settled as failed).
    attempt: int
    #: The record's store key (SHA-256 hex of scope, tool and key): unique across tenants, tools
    #: and servers sharing a store, and the name `mcp-once keys` shows. Build a downstream
    #: idempotency key from this, not from `key` alone.
    record: str
    #: The tool's name.
    tool: str


_current: contextvars.ContextVar[Claim | None] = contextvars.ContextVar(
    "mcp_once_current_claim", default=None
)


def current_claim() -> Claim | None:
    """The claim of the guarded tool call running in this context; None outside one (no key,
    an unguarded tool, `fail_open` with the store down, or code that is not inside a tool)."""
    return _current.get()


#: Publish a claim to the tool for as long as it runs (`publish(claim)` answers the token that
#: `withdraw(token)` takes back): the context variable's own methods, no frame of ours per call.
publish = _current.set
withdraw = _current.reset
