"""DBOS: idempotency keys from the step a call runs in, so a recovered step replays its calls.

    @DBOS.step()
    async def charge(order: str) -> str:
        async with Client(url) as client:
            session = RetryingSession(client, key_source=step_key)
            result = await session.call_tool("pay", {...})
        ...

DBOS runs a step *at least once*: a process killed after the MCP server ran the tool but before
DBOS recorded the step's output runs the step again when `DBOS.launch()` recovers the workflow.
A key minted in the dead process (`uuid4()`) is lost with it; `step_key` builds the key from what
the re-run has too: the workflow id (`DBOS.workflow_id`) and the step's position in it
(`DBOS.step_id`), so the server recognises the re-run's call and replays the stored result.

How DBOS numbers steps (dbos 3.x): `step_id` is the workflow's operation counter (`function_id`)
at the step's start. The workflow's durable operations (steps, child workflows, `DBOS.sleep`,
messages, events, ...) each take the next integer, in call order. Recovery runs the workflow
function again from the top; each operation takes the same number again (DBOS checks the
recorded step name against it), recorded steps return their recorded output without running,
and the first unrecorded step runs again, under the *same* `step_id`. Retries of a step
(`retries_allowed=True`) run under its one `step_id` too. So (workflow id, step id) names one
step on every run of it, and only that step.

Several MCP calls in one step get distinct keys by their order in the step: the N-th call of a
step execution gets ordinal N (`step_key_from("dbos", workflow_id, str(step_id), ordinal=N)`,
hashed, so workflow ids never reach the wire or a server's log). The count restarts with every
execution of the step (a recovery, and each retry attempt), so the re-run's N-th call sends the
first run's N-th key. Calls made concurrently inside one step take ordinals in the order they ask
for a key: start them in an order every run repeats.

A tool keyed by an argument (the listing's `keyArgument`) whose arguments already hold a key (a
model filled it) is called under that key: a key source is asked only for calls that bring none,
so the step's key gives way to it and takes no ordinal; otherwise the step's key goes in that
argument as well as in `_meta`.

Outside a DBOS step (in workflow code, or outside any workflow) `step_key` raises `NotInStep`:
workflow code is re-executed on every recovery, and a call from it is not a step whose position
DBOS records, so there is no identity to key it by; a fresh random key there would silently charge
twice after a crash. Put the call in a step. To send a random key outside steps on purpose, wrap
the source: `lambda request: step_key(request) if DBOS.step_id is not None else None`.

What re-executes by DBOS's design (new keys, so the server runs the tool again): a new workflow
id, and `DBOS.fork_workflow` (a new workflow id; the steps it copies are not re-run, the ones after
the fork point are). `DBOS.resume_workflow` keeps the id, so its re-run steps replay. Starting a
*finished* workflow id again (`SetWorkflowID`) runs nothing: DBOS returns the recorded result. A
re-run later than the server's key retention executes again. Workflow ids are the namespace:
two applications (two system databases) that choose the same ids (`order-42`) and call one
server would send each other's keys; DBOS's generated ids are UUIDs.

Pin `application_version`. `DBOS.launch()` recovers only the pending workflows of its own
`executor_id` (`"local"` unless `DBOS__VMID` or the config sets one; under DBOS Conductor,
Conductor reassigns them) and its own `application_version`. Unset, the version is a hash of the
workflow functions' source (and of the DBOS version): deploying a code fix changes it, and the
workflows that crashed under the old code are not recovered by the new process (they stay
`PENDING`, the tool call unfinished). Set it in the config, and change it only when a workflow's
step sequence changes incompatibly:

    DBOS(config={"name": "shop", "system_database_url": db_url, "application_version": "1"})

Needs the `dbos` extra (`pip install "mcp-once[dbos]"`).
"""

from __future__ import annotations

from dbos import DBOS

from ._key import KeyRequest, Ordinals, step_key_from

__all__ = ["KEY_SOURCE", "NotInStep", "step_key"]

#: The first part of the step identity `step_key` hashes (the engine's name: keys of DBOS steps
#: and of other engines' steps never collide). Keys are `step_key_from`'s, prefixed `step-`.
KEY_SOURCE = "dbos"


class NotInStep(RuntimeError):
    """`step_key` was asked for a key outside a DBOS step: nothing would send the same key again
    after a crash. Raised before anything is sent."""


#: Per execution of a step: DBOS makes a fresh `StepStatus` for each execution (in the step's own
#: context) and, on a retry (`retries_allowed`), sets its `current_attempt` on the same object.
_ordinals = Ordinals()


def _next_ordinal() -> int:
    status = DBOS.step_status
    if status is None:  # pragma: no cover - step_key checked step_id first
        raise NotInStep("no DBOS step status")
    return _ordinals.take(status, status.current_attempt)


def step_key(request: KeyRequest) -> str:
    """A `KeySource`: the key of this call from the DBOS step it runs in.

    `RetryingSession(client, key_source=step_key)` (or any adapter's `key_source=`). The key is
    `step_key_from("dbos", DBOS.workflow_id, str(DBOS.step_id), ordinal=N)` for the N-th call of
    this execution of the step; the same on every run of the step. Raises `NotInStep` outside a
    step (see the module doc). A `key_step` block the caller opened does not change it: the
    step's identity is DBOS's.
    """
    workflow_id = DBOS.workflow_id
    step_id = DBOS.step_id
    if workflow_id is None or step_id is None:
        where = "in workflow code" if workflow_id is not None else "outside any DBOS workflow"
        raise NotInStep(
            f"step_key was asked for the key of {request.tool!r} {where}: call MCP tools from a"
            " @DBOS.step, whose position DBOS records, so that a recovered run sends the same key"
        )
    return step_key_from(KEY_SOURCE, workflow_id, str(step_id), ordinal=_next_ordinal())
