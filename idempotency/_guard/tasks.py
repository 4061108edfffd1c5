"""Task-augmented calls (SEP-2663, `io.modelcontextprotocol/tasks`): a created task as a record's
answer (rule 23).

A task id is minted by the server, so creating a task is not idempotent by itself: a client whose
`CreateTaskResult` was lost has no id to poll and sends the call again. Under the guard the
creation is the call: the record keeps the `CreateTaskResult` the first creation returned, and a
re-send of the key gets that same task (same `taskId`), marked as a replay, never a second task.

Kept as the record's ordinary stored result, so no store learns a new field and every operator
tool reads it: a `CallToolResult` with no content whose `_meta` holds the task, as the task
backend produced it, under `wire.TASK_META` (domain form, rule 6). `as_record` makes that
result of what a backend returned; `TaskCreated.of_record` turns a stored (and stamped) one back
into the wire's `CreateTaskResult`, the replay marker in its `_meta`. A record that holds a task is
kept at least as long as the task itself (`retention`): a re-send within the task's TTL always
finds it.

The task's body is fenced separately (`task_body.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from mcp_types import CallToolResult, InputRequiredResult
from pydantic import BaseModel, Field, RootModel, ValidationError, create_model

from .. import wire

#: The `resultType` of a task-augmented call's answer (SEP-2663's claimed result).
TASK_RESULT_TYPE = "task"


def task_payload(value: object) -> dict[str, Any] | None:
    """The wire form of `value` when it is a `CreateTaskResult` (a model or a mapping whose
    `resultType` is "task" and which names its `taskId`); None for anything else."""
    if isinstance(value, BaseModel):
        if not _may_be_a_task(value):
            return None
        dumped = value.model_dump(by_alias=True, mode="json", exclude_none=True)
    elif isinstance(value, Mapping):
        dumped = dict(value)
    else:
        return None
    if dumped.get("resultType") != TASK_RESULT_TYPE or not isinstance(dumped.get("taskId"), str):
        return None
    return dumped


#: What a model class's wire dump says of `resultType`, by class (`_result_type_of`).
_NEVER = ""
_DUMP = None


@functools.cache
def _result_type_of(cls: type[BaseModel]) -> str | None:
    """Where `cls`'s wire dump (`by_alias`, as `task_payload` dumps) takes its `resultType`:
    `_NEVER` when no instance's dump can hold one, the attribute when exactly one plain field
    is dumped under that name, `_DUMP` when only a dump can tell (a serializer of the model's
    own, a root model, a computed field or extra fields that may name it, a serializer on that
    field)."""
    decorators = cls.__pydantic_decorators__
    if (
        cls.__pydantic_root_model__  # its dump is its root's: a mapping names any key
        or cls.model_dump is not BaseModel.model_dump
        or decorators.model_serializers
        or cls.model_config.get("extra") == "allow"
    ):
        return _DUMP
    if any(
        (info.alias or name) == "resultType" for name, info in cls.model_computed_fields.items()
    ):
        return _DUMP
    named = [
        name
        for name, info in cls.model_fields.items()
        if (info.serialization_alias or name) == "resultType"
    ]
    if not named:
        return _NEVER
    serialized = {field for d in decorators.field_serializers.values() for field in d.info.fields}
    if len(named) > 1 or named[0] in serialized or "*" in serialized:
        return _DUMP
    return named[0]


def _may_be_a_task(value: BaseModel) -> bool:
    """Whether `value`'s dump may name a task, told without dumping it where its class allows:
    every guarded call's result passes here, and a dump walks all of it (its structured content
    included) only to find no `resultType` (a FastMCP `ToolResult`) or "complete"."""
    where = _result_type_of(type(value))
    if where is _DUMP:
        return True
    if where == _NEVER:
        return False
    found = getattr(value, where)
    return not (found is None or (isinstance(found, str) and found != TASK_RESULT_TYPE))


def as_record(payload: Mapping[str, Any]) -> CallToolResult:
    """The result a record keeps for a created task: no content, the task under `TASK_META`
    (without any marker of ours a backend may have copied into its `_meta`)."""
    task = dict(payload)
    meta = task.get("_meta")
    if isinstance(meta, dict):
        meta = {k: v for k, v in meta.items() if k != wire.IDEMPOTENCY_META}
        if meta:
            task["_meta"] = meta
        else:
            del task["_meta"]
    return CallToolResult.model_validate({"content": [], "_meta": {wire.TASK_META: task}})


def stored_task(result: CallToolResult) -> dict[str, Any] | None:
    """The task a record's result holds (`as_record`), or None for a plain tool result."""
    meta = result.meta
    task = meta.get(wire.TASK_META) if meta else None
    return task if isinstance(task, dict) else None


def retention(result: CallToolResult, kept: float) -> float:
    """How long a record holding `result` is kept: `kept`, or the task's own TTL (`ttlMs`) when
    that is longer, so that a re-send within the task's life always finds the task."""
    task = stored_task(result)
    ttl = None if task is None else task.get("ttlMs")
    if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0:
        return max(kept, ttl / 1000)
    return kept


class TaskCreated(RootModel[dict[str, Any]]):
    """A `CreateTaskResult` on its way to the client, exactly as the backend produced it plus
    the guard's marker in its `_meta`: a replay of the task a key created says `replayed`.

    A root model, so it dumps to exactly the task's wire fields (`resultType: "task"`, `taskId`,
    `status`, ...): it is what a task backend's own result dumps to, whichever backend made it.
    """

    @property
    def task_id(self) -> str:
        return str(self.root["taskId"])

    @property
    def marker(self) -> dict[str, Any] | None:
        """The guard's marker (`wire.IDEMPOTENCY_META`), if the result carries one."""
        meta = self.root.get("_meta")
        found = meta.get(wire.IDEMPOTENCY_META) if isinstance(meta, dict) else None
        return found if isinstance(found, dict) else None

    @classmethod
    def of_record(cls, result: CallToolResult) -> TaskCreated | None:
        """The task a stored result holds, with every other `_meta` entry of the result (the
        guard's marker, stamped on it) moved to the task's `_meta`; None for a tool result."""
        task = stored_task(result)
        if task is None:
            return None
        extra = {k: v for k, v in (result.meta or {}).items() if k != wire.TASK_META}
        return cls(_with_meta(task, extra) if extra else dict(task))


def _with_meta(task: Mapping[str, Any], entries: Mapping[str, Any]) -> dict[str, Any]:
    """`task` with `entries` added to its `_meta` (its own entries kept)."""
    payload = dict(task)
    own = payload.get("_meta")
    payload["_meta"] = {**(own if isinstance(own, dict) else {}), **entries}
    return payload


def mark_task_replay(task: Mapping[str, Any], marker: Mapping[str, Any]) -> dict[str, Any]:
    """`task` (a `CreateTaskResult`'s wire form) with `marker` as the guard's entry in its
    `_meta`: how a replayed task reaches the client (public, for the proxy and other hosts)."""
    return _with_meta(task, {wire.IDEMPOTENCY_META: dict(marker)})


#: A task backend's own result class, extended with `_meta` (its `typed` form), per class.
_WITH_META: dict[type[BaseModel], type[BaseModel]] = {}


def typed(task: TaskCreated, cls: type[BaseModel] | None) -> BaseModel:
    """`task` as an instance of the backend's own `CreateTaskResult` class `cls` (a subclass of
    it that also keeps `_meta`, for the guard's marker), so that code in the same process that
    checks the class the backend returns sees that class, replays included; `task` itself when
    `cls` is unknown (a replay before this process created a task of the tool) or does not take
    the task's fields. Either dumps to the same wire form."""
    if cls is None:
        return task
    marked = _WITH_META.get(cls)
    if marked is None:
        marked = _WITH_META[cls] = create_model(
            cls.__name__,
            __base__=cls,
            meta=(dict[str, Any] | None, Field(default=None, alias="_meta")),
        )
    fields: dict[str, Any] = {}
    for name, info in cls.model_fields.items():
        wire_name = info.serialization_alias or info.alias or name
        if wire_name in task.root:
            fields[name] = task.root[wire_name]
    try:
        return marked.model_validate({**fields, "_meta": task.root.get("_meta")}, by_name=True)
    except ValidationError:
        return task


def recorded(value: object) -> CallToolResult | None:
    """What a record keeps for `value` when it is a created task (`as_record`); None when it is
    not one (an entry point then stores it as a tool result)."""
    payload = task_payload(value)
    return None if payload is None else as_record(payload)


def rendered(
    answer: CallToolResult | InputRequiredResult,
) -> CallToolResult | InputRequiredResult | TaskCreated:
    """An entry point's answer as the wire takes it: a record's task (`TaskCreated`), anything
    else as it is."""
    if isinstance(answer, CallToolResult):
        task = TaskCreated.of_record(answer)
        if task is not None:
            return task
    return answer
