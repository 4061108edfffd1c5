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

The fence tells executions apart; a downstream idempotency key must tell *intents* apart (rule
18): every execution that may be the same effect (a re-send, a takeover, a release or an
operator's `settle --failed` followed by a new claim, a reconciler's "not happened") must reach
the system the tool writes to under one key, so that where the earlier execution did happen after
all, that system's own record answers; a new intent (rule 15's repeat after a delivered answer, a
record claimed again after it expired) must get a new key, or that system answers it with the
earlier intent's stored response and the caller's second charge silently never happens. The
store's transitions already say which is which: a new intent starts counting `attempts` from 1,
every other transition counts one more fence *and* one more attempt. So the intent is the fence
its first execution ran under, `fence - attempts + 1`, read off the claim with no store of its own.
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
    #: How many executions this call (its intent) has seen, this one included (1 on a first run;
    #: more after a takeover, or after a claim that was released or settled as failed; 1 again
    #: for a deliberate repeat, rule 15).
    attempt: int
    #: The record's store key (SHA-256 hex of scope, tool and key): unique across tenants, tools
    #: and servers sharing a store, and the name `mcp-once keys` shows. Hand the system the tool
    #: writes to `downstream_key` (built from this), never `key` alone.
    record: str
    #: The tool's name.
    tool: str

    @property
    def intent(self) -> int:
        """Which intent of the record this execution serves: the fence its intent's first
        execution ran under (1 for the record's first call). The same for every execution that
        may be the same effect; higher only for a new intent (see the module's docstring)."""
        return intent_of(self.fence, self.attempt)

    @property
    def downstream_key(self) -> str:
        """The idempotency key to hand the system the tool writes to (a payment provider's
        `Idempotency-Key`, a row's unique key, an upstream MCP server's key): the record's store
        key for its first intent, that key, `/` and the intent number for a later one. The same
        on every re-send, takeover, replica and retry after `settle --failed` of one call; new for
        a deliberate repeat (rule 15). At most 64 + 1 + 20 printable ASCII characters."""
        return downstream_key_of(self.record, self.fence, self.attempt)


def intent_of(fence: int, attempts: int) -> int:
    """The intent of the execution under `fence` that is its intent's `attempts`-th."""
    return fence - attempts + 1


def downstream_key_of(record: str, fence: int, attempts: int) -> str:
    """`Claim.downstream_key` of an execution of `record`: the record itself for its first intent
    (what `current_claim().record` handed downstream before intents were told apart, so records
    written downstream before keep matching), `record/N` for intent N > 1."""
    number = intent_of(fence, attempts)
    return record if number <= 1 else f"{record}/{number}"


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
