"""mcp-once, client side: annotation-gated, keyed retries for MCP tool calls.

`RetryingSession` is the client; `RetryPolicy` configures it; `OutcomeUnknown`, `NotExecuted` and
`ToolCallError` are how a call ends without a result; `CallReport` says what each call did.
`RetryPolicy(on_retry=, on_give_up=)` takes hooks (`RetryHook` gets a `RetryEvent`, `GiveUpHook`
the `OutcomeUnknown` or `NotExecuted` about to be raised); `KeyKind` names where a call's key came
from, as telemetry records it (docs/observability.md). For tooling of your own (a baseline retry
loop, an invariant checker; the `mcp-once` command's scenario engine uses these):

- `tool_session(session)`: any session `RetryingSession` accepts, as the `ToolSession` it drives
  (one keyed `tools/call`, one page of `tools/list`, `closed()`, the list-changed hook);
  `InputRoundSession`, the optional capability of one to carry an input-required round
  (`RetryingSession.call_tool(..., allow_input_required=True)`); `TaskSession`, the optional
  capability of one to send the tasks extension's requests (SEP-2663: `RetryingSession.create_task`
  on a session declaring `TasksExtension` (`TASKS_EXTENSION`), whose answer is a flat
  `TaskCreated` of `resultType` `TASK_RESULT_TYPE`, then `get_task` (a `TaskState`),
  `task_result`, `update_task`, `cancel_task`).
- `SessionSlot`: the reconnection half of `RetryingSession`: one live session, replaced through a
  `Connect` factory when it dies, shared by every caller (raises `ReconnectFailed`, or
  `SessionUnavailable` when it has no factory). `RetryingSession.call_tool` never raises either:
  they end a call as the last error of a `NotExecuted` (`refresh_tools`, which calls no tool,
  raises them as they are).
- `TransportFailed`: a request that got no answer at the HTTP layer (refused, no such host, TLS,
  timeout), naming the URL with credentials redacted; the last error in a `NotExecuted` or
  `OutcomeUnknown` when that is why the call ended.
- `SessionUnavailable`: `SessionSlot.acquire` has no live session and no way to make one.
- `session_gone(error)`: a request sent on a session directly (outside `call_tool`) was refused
  because the server no longer knows that session (nothing ran); `RetryingSession.discard` then
  has the next call open a new one.
- `attempt_once(send, tool=, key=)`: one attempt of a keyed `tools/call` the caller sends by its
  own means (raw, its answer read once), its failure judged as `RetryingSession` judges an
  attempt's (`NotExecuted`, `OutcomeUnknown`, `ToolCallError`), with no retry (a proxy's fast path).
- Keys from where the call runs (a durable engine's step, so a re-run resends the first run's
  keys): `KeySource` (`RetryingSession(..., key_source=)`: a `KeyRequest` in, a key or None out),
  `key_step(*identity)` (numbers a step's calls: `KeyRequest.ordinal`), `step_key_from` (a step
  identity and an ordinal as a hashed key) and `step_keys` (the ready source built from both).
- Runs that survive a restarted agent: `Run` (`async with Run(run_id, journal=...) as run:`,
  then `RetryingSession(..., run=run)`: keys from the run id and each call's position, intents
  journalled before they are sent), `Turn` (`run.turn(n)`: the calls of one model response,
  numbered by their index in it), the journals (`SQLiteJournal`, `MemoryJournal`, `Journal`,
  `open_journal`) and the refusals (`RunDiverged`, `RunExpired`, `RunBusy`, `RunFinished`).
- `GATED`: the `FailureKind`s after which the tool may have run, whose retry the annotation gate
  decides (`AttemptReport.failure` in one of them, followed by another attempt, is a gated retry).
"""

import logging

from ._budget import RetryBudget
from ._classify import session_gone
from ._gate import GATED
from ._hooks import GiveUpHook, RetryEvent, RetryHook
from ._http import (
    RetryAwareTransport,
    TransportFailed,
    http_client_factory,
    streamable_http_transport,
)
from ._journal import (
    Entry,
    Journal,
    JournalError,
    JournalUnavailable,
    MemoryJournal,
    RunBusy,
    RunFinished,
    RunSummary,
    SQLiteJournal,
    open_journal,
)
from ._key import (
    KeyKind,
    KeyRequest,
    KeySource,
    derive_key,
    key_step,
    mint_key,
    step_key_from,
    step_keys,
)
from ._once import attempt_once
from ._outcome import (
    InvalidParams,
    KeyReused,
    NotExecuted,
    OutcomeUnknown,
    ServerOutcomeUnknown,
    ToolCallError,
)
from ._policy import MAX_ATTEMPTS_CEILING, Override, RetryPolicy
from ._reconnect import Connect, ReconnectFailed, SessionSlot, SessionUnavailable
from ._report import AttemptReport, CallOutcome, CallReport, FailureKind, GiveUpReason
from ._run import Run, RunDiverged, RunExpired, Turn, run_key
from ._session import RetryingSession
from ._sessions import InputRoundSession, SessionLike, TaskSession, ToolSession, tool_session
from ._tasks import TASK_RESULT_TYPE, TASKS_EXTENSION, TaskCreated, TasksExtension, TaskState
from ._testing import testing

# A library is silent unless its user asks (the standard library's convention for libraries):
# without this, a program that configured no logging would see our warnings through Python's
# last-resort handler. Configure the "orchestrator" logger to see them.
logging.getLogger("orchestrator").addHandler(logging.NullHandler())

__all__ = [
    "GATED",
    "MAX_ATTEMPTS_CEILING",
    "TASKS_EXTENSION",
    "TASK_RESULT_TYPE",
    "AttemptReport",
    "CallOutcome",
    "CallReport",
    "Connect",
    "Entry",
    "FailureKind",
    "GiveUpHook",
    "GiveUpReason",
    "InputRoundSession",
    "InvalidParams",
    "Journal",
    "JournalError",
    "JournalUnavailable",
    "KeyKind",
    "KeyRequest",
    "KeyReused",
    "KeySource",
    "MemoryJournal",
    "NotExecuted",
    "OutcomeUnknown",
    "Override",
    "ReconnectFailed",
    "RetryAwareTransport",
    "RetryBudget",
    "RetryEvent",
    "RetryHook",
    "RetryPolicy",
    "RetryingSession",
    "Run",
    "RunBusy",
    "RunDiverged",
    "RunExpired",
    "RunFinished",
    "RunSummary",
    "SQLiteJournal",
    "ServerOutcomeUnknown",
    "SessionLike",
    "SessionSlot",
    "SessionUnavailable",
    "TaskCreated",
    "TaskSession",
    "TaskState",
    "TasksExtension",
    "ToolCallError",
    "ToolSession",
    "TransportFailed",
    "Turn",
    "attempt_once",
    "derive_key",
    "http_client_factory",
    "key_step",
    "mint_key",
    "open_journal",
    "run_key",
    "session_gone",
    "step_key_from",
    "step_keys",
    "streamable_http_transport",
    "testing",
    "tool_session",
]
