"""The workflows and activities of the Temporal crash tests, and the worker that runs them.

Shared by the worker process (`temporal_worker.py`, killed in a crash window) and by the tests
that run a worker in-process (no crash needed). Two legs, each with the adapter or without it
(`ADAPTER` in the environment: `on`, `off`, or `keys-only` for the session leg keyed but without
the retention check; the environment, so a restarted worker runs the same code):

- `plugin`: `temporalio-mcp`'s `MCPPlugin`, whose factory makes a `KeyedMCPClient` (adapter on)
  or a plain `mcp.Client` (off); the workflow calls through `TemporalMCPClient`.
- `session`: a plain activity calling through `RetryingSession(activity_session(client),
  key_source=activity_key)` (on) or `RetryingSession(client)` (off), with `McpOnceInterceptor`.

Every activity attempt appends one JSON line (activity id, attempt, run id) to `ATTEMPTS_LOG`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from crash_point import crash_point
    from mcp import Client
    from mcp_types import TextContent
    from temporalio.mcp import MCPPlugin, TemporalMCPClient

    from idempotency import wire
    from orchestrator import RetryingSession
    from orchestrator.temporal import (
        KeyedMCPClient,
        McpOnceInterceptor,
        activity_key,
        activity_session,
    )

SHOP_URL = "MCP_ONCE_SHOP_URL"
ADAPTER = "MCP_ONCE_ADAPTER"
ATTEMPTS_LOG = "MCP_ONCE_ATTEMPTS_LOG"
TASK_QUEUE = "MCP_ONCE_TASK_QUEUE"
TEMPORAL = "MCP_ONCE_TEMPORAL"
#: Seconds an activity attempt may run: the time a killed worker's attempt takes to be retried.
START_TO_CLOSE = 3.0


@dataclasses.dataclass
class Order:
    """What a workflow pays: one `pay` per call id, `cents` (+ index) each."""

    call_ids: list[str]
    cents: int = 100
    #: A key every call of the workflow sends in `_meta` (the key-reuse test).
    meta_key: str | None = None
    #: Continue-As-New this many times, one cent more each run.
    continue_times: int = 0
    #: Attempt 1 raises after its calls, so Temporal retries the activity.
    fail_first: bool = False
    #: The activity adds its attempt number to `cents`: arguments that change between attempts.
    cents_by_attempt: bool = False
    #: Seconds before Temporal's next attempt.
    retry_after: float = 0.2


def _config(order: Order) -> dict[str, Any]:
    return {
        "start_to_close_timeout": timedelta(seconds=START_TO_CLOSE),
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=order.retry_after),
            backoff_coefficient=1.0,
            maximum_interval=timedelta(seconds=max(order.retry_after, 0.5)),
        ),
    }


def _text(content: Any) -> str:
    return "".join(part.text for part in content if isinstance(part, TextContent))


def _status(meta: Any) -> str | None:
    record = (meta or {}).get(wire.IDEMPOTENCY_META)
    return record.get("status") if isinstance(record, dict) else None


@workflow.defn
class PluginPay:
    """Pays through `temporalio-mcp`: one `call-tool` activity per call."""

    @workflow.run
    async def run(self, order: Order) -> list[dict[str, Any]]:
        shop = TemporalMCPClient("shop", activity_config=_config(order))  # type: ignore[arg-type]
        out = []
        for index, call_id in enumerate(order.call_ids):
            meta = {wire.KEY_META: order.meta_key} if order.meta_key else None
            arguments = {"call_id": call_id, "account": "acme", "cents": order.cents + index}
            result = await shop.call_tool("pay", arguments, meta=meta)  # type: ignore[arg-type]
            out.append({"text": _text(result.content), "status": _status(result.meta)})
        return out


@workflow.defn
class SessionPay:
    """Pays from one plain activity (`session_pay`), Continuing-As-New if asked."""

    @workflow.run
    async def run(self, order: Order) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = await workflow.execute_activity(
            session_pay, order, **_config(order)
        )
        if order.continue_times > 0:
            workflow.continue_as_new(
                dataclasses.replace(
                    order, continue_times=order.continue_times - 1, cents=order.cents + 1
                )
            )
        return out


def _note_attempt() -> None:
    info = activity.info()
    path = os.environ.get(ATTEMPTS_LOG)
    if path:
        line = {"activity_id": info.activity_id, "attempt": info.attempt}
        line["run_id"] = info.workflow_run_id
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")


def _adapter() -> bool:
    return os.environ.get(ADAPTER, "on") != "off"


@activity.defn
async def session_pay(order: Order) -> list[dict[str, Any]]:
    """Leg B: the activity calls the shop itself, through `RetryingSession`."""
    _note_attempt()
    attempt = activity.info().attempt
    out = []
    async with Client(os.environ[SHOP_URL]) as client:
        mode = os.environ.get(ADAPTER, "on")
        if mode == "on":
            session = RetryingSession(activity_session(client), key_source=activity_key)
        elif mode == "keys-only":  # keyed, without the retention check
            session = RetryingSession(client, key_source=activity_key)
        else:
            session = RetryingSession(client)
        for index, call_id in enumerate(order.call_ids):
            cents = order.cents + index + (attempt if order.cents_by_attempt else 0)
            arguments = {"call_id": call_id, "account": "acme", "cents": cents}
            crash_point("before")
            result, report = await session.call_tool_with_report("pay", arguments)
            out.append(
                {"text": _text(result.content), "status": _status(result.meta), "key": report.key}
            )
        crash_point("after")
    if order.fail_first and attempt == 1:
        raise RuntimeError("attempt 1 fails after its calls, so that Temporal runs attempt 2")
    return out


def _probe(base: type[Client]) -> type[Client]:
    """Leg A's client class: `base`, noting each attempt and dying in the crash windows."""

    class Probe(base):  # type: ignore[misc, valid-type]
        async def call_tool(self, name: str, arguments: Any = None, *args: Any, **kw: Any) -> Any:
            _note_attempt()
            crash_point("before")
            result = await super().call_tool(name, arguments, *args, **kw)
            crash_point("after")
            return result

    return Probe


def worker_options(task_queue: str) -> dict[str, Any]:
    """The `Worker` arguments of both legs, with or without the adapter (`ADAPTER`)."""
    url = os.environ[SHOP_URL]
    client_class = _probe(KeyedMCPClient if _adapter() else Client)
    return {
        "task_queue": task_queue,
        "workflows": [PluginPay, SessionPay],
        "activities": [session_pay],
        "plugins": [MCPPlugin({"shop": lambda: client_class(url)})],
        "interceptors": [McpOnceInterceptor()] if _adapter() else [],
        # No sticky cache: a workflow task after a crash goes to the normal queue at once
        # instead of waiting out the dead worker's sticky queue.
        "max_cached_workflows": 0,
    }
