"""mcp-once, server side: idempotency keys, fenced leases and replays for MCP tools.

Guarding tools: `idempotent` (one `MCPServer` tool), `install` (every tool of an `MCPServer`)
and `idempotent_call_tool` (a low-level `Server`), each with the options of `Policy`; a FastMCP
server adds `idempotency.fastmcp.IdempotencyMiddleware`. Inside a guarded tool,
`current_claim()` is the claim it runs under, for fencing its own downstream writes (its
`downstream_key` is the idempotency key to hand the system it writes to, one per intent); a tool
whose own downstream call broke after it may have been received (a proxy's upstream link) raises
`Interrupted`, and the caller gets OUTCOME_UNKNOWN instead of a stored error (`OutcomeLost`,
when nothing more can come of that call: the record turns UNKNOWN at once). The
`on_replay` option takes a `ReplayHook`: called with a `Replay` (tool, age, executions, key
source) each time a call is answered from its record (docs/observability.md). The `reconcile`
option takes a `Reconciler` (or a mapping from tool name to one): asked with an `InDoubt` about an
execution whose outcome is unknown, it answers with a `Reconciled` (docs/reconcile.md).
Task-augmented calls (SEP-2663, rule 23): `idempotent_tasks` wraps an `MCPServer` tasks
extension (an `IdempotentTasks`) so that a key creates one task and every re-send gets it; the
low-level handler and the FastMCP middleware keep a task the same way. `TaskCreated` is a kept
task on its way out, `mark_task_replay` puts the replay marker on a task's wire form.

Key stores: `open_store(url)`, or `MemoryKeyStore`, `SQLiteKeyStore`, `RedisKeyStore` directly;
anything implementing `KeyStore` will do. Records (`Record`, `RecordState`) and the store errors
(`StoreError` and its subclasses) are the same for every backend.

Operator tooling (what `mcp-once keys` is built on): `store_key` (with `default_scope` and
`CallScope`) names the record of a key a client sent; `principal_digest` names an authenticated
principal as records' histories do; `KeyStore.get`, `list_records`, `settle`
and `purge_expired` read and settle records, and `unreadable_records()` reports the ones a
listing could not read; `decode_result` (a `StoredResult`, or `UnreadableResult`),
`domain_form` and `encode_result` read and write stored results (`check_result_envelope` tells a
damaged one without the SDK); `rfc3339` formats times as the
result marker does; `DEFAULT_LEASE` is the default lease, the unit a grace period before
settling a record as failed is counted in; `history_interruption` (the `interrupted` event that
left a record UNKNOWN, saying whether its holder saw the execution end) and
`history_operator_settle` (the settle that made a record COMPLETED, which `settle(...,
replacing=fence)` may correct) read a record's history. `in_doubt_records(store)` lists the
records in doubt (UNKNOWN, or IN_PROGRESS under a lease that ran out: `lease_ran_out`), which
never expire. `reconcile_unknown(app, store)` (a `Reconciliation` per record) puts every
in-doubt record of a server to its tool's reconciler; `turn_unknown(store, record)` turns a
record whose lease ran out UNKNOWN as a client's retry would; `history_servers(history)` and
`record_servers(store, key)` name the servers a record's history says claimed it (rule 25:
operator tools act within one server's records). A store marks itself at its first write
(`MarkedStore.mark`, a `StoreMark`), so that a read of a place nothing of mcp-once's is kept at
(`holds_anything`) is told from an empty store.

Names whose modules load the MCP SDK, OpenTelemetry or redis-py (the guard, the integrations,
`RedisKeyStore`, `decode_result`, ...) are imported on first use, so that `import idempotency`
and the operator commands that only read a store start in a fraction of a second.

`idempotency.wire` is the wire contract shared with the client library. Modules and packages
whose names start with `_` are private: `_guard/` (the guard and its parts), `_stores/` (the key
stores) and `_integrations/` (the framework integrations); their public names are the ones
re-exported here.
"""

import importlib
import logging
from typing import TYPE_CHECKING, Any

from ._guard.current_claim import Claim, current_claim
from ._guard.defaults import DEFAULT_LEASE
from ._guard.envelope import UnreadableResult, check_result_envelope, rfc3339
from ._guard.fingerprint import fingerprint
from ._guard.scope import CallScope, ScopeFn, default_scope, store_key
from ._stores.audit_key import AuditKey
from ._stores.history import AuditedStore, AuditEntry
from ._stores.history import Event as HistoryEvent
from ._stores.history import interruption as history_interruption
from ._stores.history import parse as parse_history
from ._stores.history import saying as history_saying
from ._stores.history import servers as history_servers
from ._stores.history import servers_of as record_servers
from ._stores.history import settled_by_operator as history_operator_settle
from ._stores.history_verify import HistoryCheck
from ._stores.history_verify import check as check_history
from ._stores.history_verify import compare_stream as compare_audit_stream
from ._stores.history_verify import verify as verify_history
from ._stores.in_doubt import in_doubt_records, lease_ran_out
from ._stores.mark import MarkedStore, StoreMark
from ._stores.memory import MemoryKeyStore
from ._stores.open import open_store
from ._stores.sqlite import SQLiteKeyStore
from ._stores.store import (
    ClaimOutcome,
    ClaimStatus,
    CorruptRecord,
    KeyStore,
    LimitExceeded,
    Record,
    RecordState,
    StoreError,
    StoreUnavailable,
    unreadable_records,
)

if TYPE_CHECKING:
    from ._guard.caller import principal_digest
    from ._guard.guard import Interrupted, OutcomeLost
    from ._guard.hooks import Replay, ReplayHook
    from ._guard.mint import KeySource
    from ._guard.policy import KeyMode, Policy, PolicyOptions
    from ._guard.reconcile import InDoubt, Reconciled, ReconcileOption, Reconciler
    from ._guard.replay import StoredResult, decode_result, domain_form, encode_result
    from ._guard.tasks import TaskCreated, mark_task_replay
    from ._integrations.lowlevel import GuardedCallTool, idempotent_call_tool
    from ._integrations.mcpserver.decorator import idempotent
    from ._integrations.mcpserver.install import install
    from ._integrations.mcpserver.tasks import IdempotentTasks, idempotent_tasks
    from ._integrations.reconcile_records import Reconciliation, reconcile_unknown, turn_unknown
    from ._stores.audit_log import export as export_audit_logs
    from ._stores.redis.store import DurabilityUnsupported, RedisKeyStore, ReplicationUnconfirmed

#: The public names whose modules load the MCP SDK, OpenTelemetry or redis-py, by where they
#: live: imported on first use (PEP 562), so that `import idempotency` and the operator commands
#: built on the stores (`mcp-once keys`, `audit`) start without them.
_ON_FIRST_USE: dict[str, str] = {
    "principal_digest": "._guard.caller",
    **dict.fromkeys(("Interrupted", "OutcomeLost"), "._guard.guard"),
    **dict.fromkeys(("Replay", "ReplayHook"), "._guard.hooks"),
    "KeySource": "._guard.mint",
    **dict.fromkeys(("KeyMode", "Policy", "PolicyOptions"), "._guard.policy"),
    **dict.fromkeys(
        ("InDoubt", "Reconciled", "ReconcileOption", "Reconciler"), "._guard.reconcile"
    ),
    **dict.fromkeys(
        ("StoredResult", "decode_result", "domain_form", "encode_result"), "._guard.replay"
    ),
    **dict.fromkeys(("GuardedCallTool", "idempotent_call_tool"), "._integrations.lowlevel"),
    "idempotent": "._integrations.mcpserver.decorator",
    "install": "._integrations.mcpserver.install",
    **dict.fromkeys(("IdempotentTasks", "idempotent_tasks"), "._integrations.mcpserver.tasks"),
    **dict.fromkeys(("TaskCreated", "mark_task_replay"), "._guard.tasks"),
    **dict.fromkeys(
        ("Reconciliation", "reconcile_unknown", "turn_unknown"), "._integrations.reconcile_records"
    ),
    "export_audit_logs": "._stores.audit_log",
    **dict.fromkeys(
        ("DurabilityUnsupported", "RedisKeyStore", "ReplicationUnconfirmed"), "._stores.redis.store"
    ),
}
#: Public names that are another name in their module.
_RENAMED = {"export_audit_logs": "export"}


def __getattr__(name: str) -> Any:
    where = _ON_FIRST_USE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), _RENAMED.get(name, name))
    globals()[name] = value  # the next use is an ordinary module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


# A library is silent unless its user asks (the standard library's convention for libraries):
# without this, a program that configured no logging would see our warnings through Python's
# last-resort handler. Configure the "idempotency" logger to see them.
logging.getLogger("idempotency").addHandler(logging.NullHandler())

__all__ = [
    "DEFAULT_LEASE",
    "AuditEntry",
    "AuditKey",
    "AuditedStore",
    "CallScope",
    "Claim",
    "ClaimOutcome",
    "ClaimStatus",
    "CorruptRecord",
    "DurabilityUnsupported",
    "GuardedCallTool",
    "HistoryCheck",
    "HistoryEvent",
    "IdempotentTasks",
    "InDoubt",
    "Interrupted",
    "KeyMode",
    "KeySource",
    "KeyStore",
    "LimitExceeded",
    "MarkedStore",
    "MemoryKeyStore",
    "OutcomeLost",
    "Policy",
    "PolicyOptions",
    "ReconcileOption",
    "Reconciled",
    "Reconciler",
    "Reconciliation",
    "Record",
    "RecordState",
    "RedisKeyStore",
    "Replay",
    "ReplayHook",
    "ReplicationUnconfirmed",
    "SQLiteKeyStore",
    "ScopeFn",
    "StoreError",
    "StoreMark",
    "StoreUnavailable",
    "StoredResult",
    "TaskCreated",
    "UnreadableResult",
    "check_history",
    "check_result_envelope",
    "compare_audit_stream",
    "current_claim",
    "decode_result",
    "default_scope",
    "domain_form",
    "encode_result",
    "export_audit_logs",
    "fingerprint",
    "history_interruption",
    "history_operator_settle",
    "history_saying",
    "history_servers",
    "idempotent",
    "idempotent_call_tool",
    "idempotent_tasks",
    "in_doubt_records",
    "install",
    "lease_ran_out",
    "mark_task_replay",
    "open_store",
    "parse_history",
    "principal_digest",
    "reconcile_unknown",
    "record_servers",
    "rfc3339",
    "store_key",
    "turn_unknown",
    "unreadable_records",
    "verify_history",
]
