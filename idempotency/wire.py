"""Names and codes on the wire, shared by both halves of mcp-once.

They live in one module so that the client and the server can never disagree about a spelling:
the contract (`semantics.md`) is the single source, and this file is its only transcription.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

E = TypeVar("E")

NAMESPACE: Final = "io.github.mcp-once/"

#: Request `params._meta`: the idempotency key, identical on every attempt of one logical call.
KEY_META: Final = NAMESPACE + "idempotency-key"
#: Request `params._meta`: the attempt number (int >= 1), informational only.
ATTEMPT_META: Final = NAMESPACE + "attempt"
#: Result `_meta` (how this answer came about) and tool definition `_meta` (the tool's policy).
IDEMPOTENCY_META: Final = NAMESPACE + "idempotency"
#: Result `_meta` marker field, `true` only on the answer a reconciler produced (rule 19): the
#: record was in doubt, the system of record said the effect happened, and this is its result
#: (`status` is "replayed"). Absent on every other answer.
MARKER_RECONCILED: Final = "reconciled"
#: Result `_meta` marker field, `true` only on an answer whose result the server the tool called
#: (the proxy's upstream, guarded by mcp-once too) replayed from its own record (rule 18): the
#: effect happened in an earlier call, at `executedAt`, and none came of this one (`status` is
#: "replayed"). Kept with the record, so its later replays say it too. Absent on every other answer.
MARKER_UPSTREAM: Final = "upstream"

#: Stored result `_meta` (never on the wire): the `CreateTaskResult` a task-augmented call created
#: (SEP-2663), kept as the record's answer so that every re-send of its key gets that task
#: (rule 23). On the way out it becomes the task itself, the marker in the task's own `_meta`.
TASK_META: Final = NAMESPACE + "task"

#: Tool definition `_meta` of a tool `mcp-once proxy` guards: what of its calls the proxy does not
#: guard, `{"unguarded": ["task"], "neverStored": ["task", "inputRequired"]}` (a task-augmented
#: call passes through unguarded; neither it nor an input_required round is ever stored).
PROXY_META: Final = NAMESPACE + "proxy"

#: The tool definition `_meta` entry's `keys` values. Every one of them honours a key the client
#: sends; they differ in what happens to a keyless call: refused (-32602), run unprotected, or run
#: under a key the server derives for that caller.
KEY_MODES: Final = ("required", "optional", "derived")

#: Tool definition `_meta` entry fields present only when the server takes keys elsewhere too:
#: the argument path (dotted for nested objects) a key may travel in, and the HTTP header name.
DEFINITION_KEY_ARGUMENT: Final = "keyArgument"
DEFINITION_KEY_HEADER: Final = "keyHeader"

#: What `argument_at` answers when no value stands at the path.
ABSENT: Final = object()

#: Another attempt with this key is running; retry after `data.retryAfterMs`.
IN_PROGRESS: Final = -32010
#: The key was used with different arguments; never retry.
KEY_REUSED: Final = -32011
#: An earlier attempt's lease expired mid-execution; reconcile, never retry blindly.
OUTCOME_UNKNOWN: Final = -32012
#: The key store could not be reached and the tool was not run; retry after backoff.
STORE_UNAVAILABLE: Final = -32013
#: The key's record cannot be read (damaged, or written by something else); the tool was not
#: run and the record was left for an operator. Never retry: the answer stays the same.
CORRUPT_RECORD: Final = -32014
#: JSON-RPC invalid params: a key that is missing where required, malformed or too long.
INVALID_PARAMS: Final = -32602

#: Keys are 1..255 printable ASCII characters (0x20..0x7E), as Stripe allows.
MAX_KEY_LENGTH: Final = 255


def key_problem(key: object) -> str | None:
    """Why `key` is not a valid idempotency key, or None when it is.

    Both halves validate with this one function so that a key the client mints is always
    one the server accepts.
    """
    if not isinstance(key, str):
        return f"the idempotency key must be a string, not {type(key).__name__}"
    if not key:
        return "the idempotency key must not be empty"
    if len(key) > MAX_KEY_LENGTH:
        return (
            f"the idempotency key is {len(key)} characters long;"
            f" at most {MAX_KEY_LENGTH} are allowed"
        )
    # ASCII and printable is exactly 0x20..0x7E (space is printable, DEL and controls are not),
    # checked in C rather than per character.
    if not (key.isascii() and key.isprintable()):
        return "the idempotency key must be printable ASCII (0x20 to 0x7E)"
    return None


def argument_path(path: object) -> tuple[str, ...]:
    """The segments of a key argument's path (`keyArgument`: dotted for nested objects, so a
    segment never contains a dot); a `TypeError`/`ValueError` for a path that names no argument."""
    if not isinstance(path, str):
        raise TypeError(f"key_argument must be a string, not {type(path).__name__}")
    segments = tuple(path.split("."))
    if not path or any(not s for s in segments):
        raise ValueError(
            f'key_argument must name an argument, nested with dots ("meta.key"); got {path!r}'
        )
    return segments


def argument_at(arguments: Mapping[str, Any] | None, segments: tuple[str, ...]) -> object:
    """The value at `segments` in a call's arguments, or `ABSENT` (a container on the way that
    is not an object holds no key: the key is absent, not malformed)."""
    node: object = arguments
    for segment in segments:
        if not isinstance(node, Mapping) or segment not in node:
            return ABSENT
        node = node[segment]
    return node


def argument_place(path: str) -> str:
    """How errors name the key argument at dotted `path`."""
    return f"argument {path!r}"


def malformed_key(
    key: object, problem: str, place: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The message and data of the -32602 answering a malformed key (`problem`, from
    `key_problem`) found at `place` (named when it is not request `_meta`, whose message stays
    as it always was). Here so that a client refusing a key before sending it, on behalf of a
    server that would refuse it, says exactly what the server says.

    The key is echoed only when it is a string short enough to be useful in a log line."""
    data: dict[str, Any] = {}
    if isinstance(key, str) and len(key) <= MAX_KEY_LENGTH:
        data["key"] = key
    data["reason"] = problem
    if isinstance(key, str) and len(key) > MAX_KEY_LENGTH:
        data["length"] = len(key)
    where = "" if place is None else f" in {place}"
    return f"Invalid idempotency key{where}: {problem}.", data


def check_hook(name: str, hook: object) -> None:
    """Refuse, where it is configured, a hook that cannot be one (`on_retry`, `on_give_up` on the
    client, `on_replay` on the server): both sides call their hooks the same way, inline and
    never awaited, so both refuse the same things with the same words."""
    if hook is None:
        return
    if not callable(hook):
        raise TypeError(f"{name} must be a callable taking one argument, or None")
    if inspect.iscoroutinefunction(hook):
        raise TypeError(f"{name} must be a plain function: hooks run inline, never awaited")


def run_hook(
    logger: logging.Logger, name: str, hook: Callable[[E], object] | None, event: E
) -> None:
    """Call a hook `check_hook` admitted: inline, never awaited; an `Exception` from it is logged
    on `logger` by its type only (its message may quote a caller's data) and dropped, so that a
    hook never breaks a call. Cancellation is never caught. Both sides call theirs through here."""
    if hook is None:
        return
    try:
        hook(event)
    except Exception as exc:
        logger.warning("the %s hook raised %s; ignored", name, type(exc).__qualname__)
