"""A task's body under a fence of its own (rule 23): a queue's redelivery never runs it twice.

The creation of a task is the keyed call (`tasks.py`); its body runs later, where the task backend
runs it (a queue worker, a task group of the server), outside the request that created it. A
backend that redelivers (a worker died, a visibility timeout ran out) would run it again. So the
body is claimed like a call of its own, keyed by its task id: the task id exists once per key
(the creation's record hands every re-send the same one), so one task id is one logical body.

- The first run claims the body's record and runs; its final result is stored with the record
  (what `tasks/get` inlines once the task ends, after a restart or on another replica:
  `body_result`).
- A redelivery of a finished body gets that stored result, marked replayed; the body does not run.
- A redelivery while the first run still holds its lease waits (bounded) and then replays, or is
  told IN_PROGRESS (-32010).
- A run that died mid-body leaves its record to its lease; the next delivery then finds it UNKNOWN
  (-32012) unless the tool may run twice (`takeover`) or a reconciler (`reconcile=`) settles it,
  exactly as for a plain call. The backend reports the task failed with that error; an operator
  settles the record (`mcp-once keys settle`).

Its record lives in the server's scope without a principal (the worker has no request; the task
id, high-entropy and server-minted, is what partitions it) under the tool's name with
`BODY_SUFFIX`, so it never shares a record with a call of the tool itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mcp_types import CallToolResult, InputRequiredResult

from .. import wire
from .envelope import UnreadableResult
from .guard import Guard, ToolCall, as_is
from .reconcile import Convert
from .replay import decode_result
from .scope import store_key

#: Appended to a tool's name for the records of its tasks' bodies.
BODY_SUFFIX = "#task-body"


def body_key(task_id: str) -> str:
    """The idempotency key of a task's body: a digest of its task id (any length, any
    characters), within the key alphabet."""
    return "task-" + hashlib.sha256(task_id.encode("utf-8")).hexdigest()


def _body_call(
    server: str, tool: str, task_id: str, arguments: Mapping[str, Any] | None
) -> ToolCall:
    """The body of task `task_id` of `tool` as the guard's call: its own record, keyed by the
    task id."""
    return ToolCall(
        server=server,
        tool=tool + BODY_SUFFIX,
        arguments=arguments,
        meta={wire.KEY_META: body_key(task_id)},
    )


async def run_task_body(
    guard: Guard,
    *,
    server: str,
    tool: str,
    task_id: str,
    arguments: Mapping[str, Any] | None,
    body: Callable[[], Awaitable[CallToolResult | InputRequiredResult]],
    error_result: Callable[[Exception], CallToolResult],
    takeover: bool,
    convert: Convert | None = None,
) -> CallToolResult | InputRequiredResult:
    """Run `body` (the task's tool body, returning its `CallToolResult`) at most once per task id
    under `guard`; the result first-hand or replayed (marker in its `_meta`), or the guard's
    `MCPError` (IN_PROGRESS, OUTCOME_UNKNOWN, STORE_UNAVAILABLE). An input-required round is
    handed back unstored, its claim released (rule 8): the leg that answers it runs again.
    `convert`: how a reconciler's `happened` value becomes the body's result, as for the tool."""
    call = ToolCall(
        server=server,
        tool=tool + BODY_SUFFIX,
        arguments=arguments,
        meta={wire.KEY_META: body_key(task_id)},
    )

    return await guard.call(
        call,
        body,
        error_result=error_result,
        takeover=takeover,
        passthrough=body,  # `fail_open` with the store down: the author's choice
        render=as_is,
        convert=convert,
    )


async def body_result(guard: Guard, server: str, tool: str, task_id: str) -> CallToolResult | None:
    """The stored final result of task `task_id`'s body, or None while it has none (running,
    never run, UNKNOWN, expired): what `tasks/get` can inline from on any replica."""
    call = _body_call(server, tool, task_id, None)
    name = store_key(guard.scope_of(call), call.tool, body_key(task_id))
    record = await guard.store.get(name)
    if record is None or record.result is None:
        return None
    try:
        return decode_result(record.result).result
    except UnreadableResult:
        return None
