"""Idempotency keys: one per logical call, minted here unless the caller brings its own.

The key is what lets a server recognise a retry as the same call, so it must be identical on
every attempt and unique across logical calls. A random 128-bit value is both, without any
coordination between clients. It is not identical across a *re-run* of the code that made the
call (a durable engine replaying a step after a crash): for that the key must come from where the
call runs, which is what a `KeySource` gives, with `key_step` numbering the calls of one step.

Where the key of a call comes from, first match wins: the caller's (`idempotency_key=`, a key
already in `meta`, or one in the tool's key argument; all that are given must agree), a framework
adapter's (`adapter_key`: it gives way to a key in the argument), the session's `key_source`, a
fresh random key (`resolve_key`).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import itertools
import json
import threading
import types
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from mcp import MCPError

from idempotency import wire


def mint_key() -> str:
    """A fresh key: a random UUID, 36 printable ASCII characters (well within the 255 limit)."""
    return str(uuid.uuid4())


@dataclass(frozen=True)
class KeyRequest:
    """What a `KeySource` is asked: which logical call needs a key, and where it runs.

    `ordinal` is this call's position (0, 1, 2, ...) among the calls that asked a key source for
    a key inside the current `key_step`, so several calls made by one step get distinct keys,
    and the N-th call gets ordinal N on every re-run of the step. `step` is that step's identity
    (the tuple given to `key_step`), or None outside any step, where `ordinal` is always 0: a
    source used outside a step must tell calls apart by something of its own.
    """

    tool: str
    arguments: Mapping[str, Any]
    ordinal: int
    step: tuple[str, ...] | None = None


#: Gives the key of a logical call from where it runs, or None for "mint a fresh one". Called
#: once per logical call (never per attempt), before anything is sent. What it raises propagates
#: to the caller, and nothing is sent: a call is never sent unkeyed because its source failed.
KeySource = Callable[[KeyRequest], str | None]


@dataclass
class _Step:
    identity: tuple[str, ...]
    counter: Iterator[int] = field(default_factory=itertools.count)


_step: contextvars.ContextVar[_Step | None] = contextvars.ContextVar(
    "mcp_once_key_step", default=None
)


@contextlib.contextmanager
def key_step(*identity: str) -> Iterator[None]:
    """Number the keyed calls made inside this block: one step of a durable engine.

    `identity` names the step the same way on every run of it (e.g. a workflow id, a run id and
    an activity id; never an attempt number, or a re-run would get new keys). Inside, each call
    that asks a `KeySource` for its key gets the next ordinal, starting at 0. The counter lives
    in the block's context (a `ContextVar` holding one counter object), so tasks started inside
    share it and calls elsewhere cannot shift it; a new block starts again at 0, so a re-run of
    the step gives its N-th call ordinal N again. Entering a block for the identity already
    current continues its count instead: restarting would give two calls of one step one key.

    Calls started concurrently inside one step take ordinals in the order they ask for a key;
    for keys that survive a re-run, start them in an order the re-run repeats.
    """
    for part in identity:
        if not isinstance(part, str):
            raise TypeError(f"step identity parts must be str, not {type(part).__name__}")
    if not identity:
        raise ValueError("key_step needs an identity: at least one string")
    current = _step.get()
    if current is not None and current.identity == identity:
        yield
        return
    token = _step.set(_Step(identity))
    try:
        yield
    finally:
        _step.reset(token)


@dataclass
class _Owned:
    ref: weakref.ref[Any]
    epoch: object
    next: int = 0


class Ordinals:
    """Ordinals 0, 1, 2, ... per live object that stands for one execution of a step, for a key
    source that cannot open a `key_step` around the step's body (it is only called from inside).

    An engine that makes a fresh object per execution of a step (a per-attempt info or status
    object) gives the count its lifetime: `take(owner)` hands out the next ordinal of `owner`'s
    execution, and a new execution starts at 0 again. Where the engine reuses the object across
    retries, pass what tells them apart as `epoch` (an attempt number): a changed epoch restarts
    the count. Owners are held by identity and weakly (they need be neither hashable nor kept
    alive), each entry dropped when its owner is collected. Thread-safe: sync steps run in
    threads, and a collection may drop an entry in the middle of a `take`.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owned: dict[int, _Owned] = {}

    def take(self, owner: object, epoch: object = None) -> int:
        """The next ordinal of `owner`'s execution (0 for its first call, or after a new epoch)."""
        ident = id(owner)
        with self._lock:
            owned = self._owned.get(ident)
            if owned is None or owned.ref() is not owner:
                owned = _Owned(weakref.ref(owner, self._dropper(ident)), epoch)
                self._owned[ident] = owned
            elif owned.epoch != epoch:
                owned.epoch, owned.next = epoch, 0
            ordinal = owned.next
            owned.next += 1
            return ordinal

    def __len__(self) -> int:
        """Owners currently counted (for tests: entries go with their owners)."""
        with self._lock:
            return len(self._owned)

    def _dropper(self, ident: int) -> Callable[[weakref.ref[Any]], None]:
        def drop(ref: weakref.ref[Any]) -> None:
            with self._lock:
                owned = self._owned.get(ident)
                if owned is not None and owned.ref is ref:
                    del self._owned[ident]

        return drop


def step_key_from(*identity: str, ordinal: int) -> str:
    """The key of the `ordinal`-th call of the step named `identity`: the same on every run.

    Built on `derive_key`, so the identity (run ids, workflow ids) is hashed and never reaches
    the wire or a server's logs.
    """
    if isinstance(ordinal, bool) or not isinstance(ordinal, int) or ordinal < 0:
        raise ValueError(f"ordinal must be a non-negative int, got {ordinal!r}")
    if not identity:
        raise ValueError("step_key_from needs an identity: at least one string")
    return derive_key("step", *identity, str(ordinal))


def step_keys(request: KeyRequest) -> str | None:
    """A ready `KeySource`: inside a `key_step`, the step's key for this call's ordinal
    (`step_key_from(*step, ordinal=...)`); outside one, None (a fresh key)."""
    if request.step is None:
        return None
    return step_key_from(*request.step, ordinal=request.ordinal)


def key_from_source(
    key_source: KeySource, tool: str, arguments: Mapping[str, Any] | None
) -> str | None:
    """Ask `key_source` for the key of one call (taking the step's next ordinal), checked.

    None means "mint one". A non-str answer is a `TypeError`, a malformed key (the server's own
    rule, `wire.key_problem`) a `ValueError`: both before anything is sent.
    """
    step = _step.get()
    request = KeyRequest(
        tool=tool,
        arguments=types.MappingProxyType(dict(arguments) if arguments is not None else {}),
        ordinal=next(step.counter) if step is not None else 0,
        step=step.identity if step is not None else None,
    )
    key = key_source(request)
    if key is None:
        return None
    if not isinstance(key, str):
        raise TypeError(f"key_source must return a str or None, not {type(key).__name__}")
    problem = wire.key_problem(key)
    if problem is not None:
        raise ValueError(f"key_source returned a bad key: {problem}")
    return key


_adapter_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mcp_once_adapter_key", default=None
)


@contextlib.contextmanager
def adapter_key(key: object) -> Iterator[None]:
    """Inside this block, a call whose `_meta` key is `key` holds it as a framework adapter's
    choice (derived from a tool-call id, a step, a key source), not as the caller's own.

    Why: where a model fills the tool's key argument (the listing's `keyArgument`), the model's
    key is the call's key. The listing tells the model to reuse it when it retries an action,
    and the model's retry is a new tool call with a new tool-call id, so only the model's key
    can say "the same action". An adapter's key therefore gives way to it, instead of the two
    being refused as disagreeing keys; with no key from the model, the adapter's key is used
    (and goes in the argument as well). The adapter puts its key in `_meta`, the one place a
    framework lets it through, and marks it here (a context variable: nothing on the wire).
    """
    token = _adapter_key.set(key if isinstance(key, str) else None)
    try:
        yield
    finally:
        _adapter_key.reset(token)


def split_adapter_key(
    meta: Mapping[str, Any] | None,
) -> tuple[Mapping[str, Any] | None, str | None]:
    """`meta` without the key an adapter placed in it (`adapter_key`), and that key; `meta`
    unchanged and None when its key is not the adapter's (or is malformed: then it is checked,
    and refused, as the caller's)."""
    placed = _adapter_key.get()
    if (
        placed is None
        or meta is None
        or meta.get(wire.KEY_META) != placed
        or wire.key_problem(placed) is not None
    ):
        return meta, None
    return {name: value for name, value in meta.items() if name != wire.KEY_META}, placed


def argument_place(segments: tuple[str, ...]) -> str:
    """How the key argument is named in errors: its dotted path, as the listing gives it."""
    return f"arguments[{'.'.join(segments)!r}]"


def model_key_refusal(
    arguments: Mapping[str, Any] | None, key_argument: tuple[str, ...] | None
) -> MCPError | None:
    """The -32602 the server answers a malformed key in the key argument with (message and data
    as the server's, from `wire.malformed_key`), or None when that argument holds no such key."""
    if key_argument is None:
        return None
    value = wire.argument_at(arguments, key_argument)
    problem = None if value is wire.ABSENT else wire.key_problem(value)
    if problem is None:
        return None
    message, data = wire.malformed_key(value, problem, wire.argument_place(".".join(key_argument)))
    return MCPError(wire.INVALID_PARAMS, message, data)


def caller_key(
    idempotency_key: object,
    meta: Mapping[str, Any] | None,
    arguments: Mapping[str, Any] | None = None,
    key_argument: tuple[str, ...] | None = None,
) -> str | None:
    """The key the caller brings, or None: `idempotency_key=`, a key in `meta` under the wire
    name, or (when the tool is listed with a `keyArgument`) a value at that path of the
    arguments, as a model or a plain client fills it. Each place is checked with the server's
    own rule (`wire.key_problem`), and places that disagree are refused, as the server refuses
    them (-32602): all with a `ValueError` before anything is sent, so none costs an attempt.
    """
    brought: list[tuple[str, object]] = []
    if idempotency_key is not None:
        brought.append(("idempotency_key", idempotency_key))
    if meta is not None and wire.KEY_META in meta:
        brought.append((f"meta[{wire.KEY_META!r}]", meta[wire.KEY_META]))
    if key_argument is not None:
        value = wire.argument_at(arguments, key_argument)
        if value is not wire.ABSENT:
            brought.append((argument_place(key_argument), value))
    for place, value in brought:
        problem = wire.key_problem(value)
        if problem is not None:
            raise ValueError(f"{place}: {problem}")
    if not brought:
        return None
    (first_place, first), *others = brought
    for place, value in others:
        if value != first:
            raise ValueError(f"{first_place} and {place} disagree; pass the key once")
    assert isinstance(first, str)
    return first


def resolve_key(
    idempotency_key: object,
    meta: Mapping[str, Any] | None,
    *,
    key_source: KeySource | None = None,
    tool: str = "",
    arguments: Mapping[str, Any] | None = None,
    key_argument: tuple[str, ...] | None = None,
) -> str:
    """The key for one logical call: the caller's (`caller_key`), the key source's, or a new one.

    Only when the caller brings no key is `key_source` asked (so a caller's key takes no
    ordinal); when it answers None, or there is none, the key is minted.
    """
    brought = caller_key(idempotency_key, meta, arguments, key_argument)
    if brought is not None:
        return brought
    return sourced_or_minted(key_source, tool, arguments)[0]


#: Where a call's key came from, as telemetry names it (`mcp_once.key_source`): the caller
#: (`idempotency_key=` or request `_meta`), the tool's key argument, a framework adapter, a run's
#: journal, the session's `key_source`, or minted afresh. Never the key itself.
KeyKind = Literal["caller", "argument", "adapter", "run", "key_source", "minted"]


def sourced_or_minted(
    key_source: KeySource | None, tool: str, arguments: Mapping[str, Any] | None
) -> tuple[str, KeyKind]:
    """The key of a call the caller brings none for: the key source's, else a fresh one."""
    if key_source is not None:
        sourced = key_from_source(key_source, tool, arguments)
        if sourced is not None:
            return sourced, "key_source"
    return mint_key(), "minted"


def with_key_argument(
    arguments: Mapping[str, Any] | None, key_argument: tuple[str, ...], key: str
) -> dict[str, Any] | None:
    """A copy of `arguments` with `key` at the `key_argument` path (objects on the way made as
    needed; the caller's mapping is untouched), or None when something on the way is not an
    object, so the key cannot go there (it still travels in `_meta`)."""
    out: dict[str, Any] = dict(arguments or {})
    node = out
    *parents, leaf = key_argument
    for segment in parents:
        child = node.get(segment, {})
        if not isinstance(child, Mapping):
            return None
        copied = dict(child)
        node[segment] = copied
        node = copied
    node[leaf] = key
    return out


def derive_key(source: str, *parts: str) -> str:
    """A key fixed by the identity of a logical call, e.g. an agent run's id and a tool-call id.

    The same parts give the same key on every attempt, in every process and after a restart, so a
    framework that re-issues a call under the same tool-call id reuses its key (and a guarded
    server replays instead of running the tool again). Parts are hashed (SHA-256 of their JSON
    list, so no two part lists collide by concatenation), which keeps the key short, printable
    ASCII whatever the ids contain, and does not put raw ids on the wire. `source` names the
    integration and prefixes the key, for whoever reads a store.
    """
    digest = hashlib.sha256(json.dumps([source, *parts]).encode()).hexdigest()
    return f"{source}-{digest[:40]}"
