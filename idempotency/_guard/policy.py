"""`Policy`: every knob of the server guard in one frozen value, with defaults that hold up.

One value shared by the decorator, `install` and the low-level handler, so that the same words
mean the same behaviour on every entry point. The defaults are argued in the field comments;
the README repeats them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from .. import wire
from .defaults import DEFAULT_LEASE
from .fingerprint import FingerprintOption, check_option
from .hooks import ReplayHook
from .keyplaces import check_header_name
from .reconcile import DEFAULT_RECONCILE_TIMEOUT, ReconcileOption, check_timeout
from .reconcile import check_option as check_reconcile
from .scope import ScopeFn, default_scope

KeyMode = Literal["required", "optional", "derived"]
#: The wire contract's spelling; a unit test keeps `KeyMode` in step with it.
KEY_MODES: tuple[str, ...] = wire.KEY_MODES

#: Stripe keeps keys at least 24 h: long enough for retries across restarts and overnight jobs.
DEFAULT_RETENTION = 24 * 3600.0
#: A keyless client's blind re-send comes within its timeout plus a reconnect: seconds to
#: minutes. Ten minutes catches those and lets a deliberate repeat later run again.
DEFAULT_DERIVED_RETENTION = 600.0
#: Bounds the shielded run (rule 10) and therefore how long a graceful shutdown drains.
DEFAULT_MAX_RUN_TIME = 300.0
#: Most tools finish within seconds; 10 s lets a concurrent duplicate replay instead of
#: failing, and stays well inside common client timeouts (60 s).
DEFAULT_WAIT = 10.0
#: Same as the stores' default limit; MCP results beyond 1 MiB are rare and costly to keep.
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024


class PolicyOptions(TypedDict, total=False):
    """The keyword options every entry point accepts (`idempotent(store, **options)`)."""

    keys: KeyMode
    retention: float
    derived: bool
    derived_retention: float
    lease: float
    max_run_time: float | None
    takeover: bool | None
    naturally_idempotent: bool
    effect_free: type[Exception] | Iterable[type[Exception]]
    scope: ScopeFn
    wait: float
    max_result_bytes: int
    fail_open: bool
    key_argument: str | None
    key_header: str | None
    fingerprint: FingerprintOption | None
    on_replay: ReplayHook | None
    reconcile: ReconcileOption | None
    reconcile_timeout: float


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive, finite number of seconds, not {value!r}")
    return float(value)


def _exception_types(value: object) -> tuple[type[Exception], ...]:
    items = (value,) if isinstance(value, type) else value
    if not isinstance(items, Iterable):
        raise TypeError("effect_free must be an exception type or an iterable of them")
    found: list[type[Exception]] = []
    for item in items:
        # Only Exception subclasses: cancellation and interpreter exits are never "effect-free
        # tool errors", and treating them as such would release a claim mid-effect.
        if not (isinstance(item, type) and issubclass(item, Exception)):
            raise TypeError(f"effect_free entries must be Exception subclasses, not {item!r}")
        found.append(item)
    return tuple(found)


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """How a guarded tool treats keys, leases, failures and the store."""

    #: How a call without a key is handled. "derived" (default): a key is minted from the caller
    #: (principal, HTTP session or connection), scope and fingerprint, so a keyless client's
    #: blind re-send is deduplicated within `derived_retention` — for that caller only; where a
    #: request has no caller identity (stateless HTTP without authentication) the call runs
    #: unprotected, and the listing that caller sees says so. "optional": keyless calls run
    #: unprotected, exactly as unwrapped. "required": keyless calls are refused with invalid
    #: params (-32602).
    keys: KeyMode = "derived"
    #: Seconds a completed record (client key) is kept and replayed.
    retention: float = DEFAULT_RETENTION
    #: Whether keyless calls may be merged under a derived key at all. False for a tool whose
    #: every call is meant to be new (`create_session`): keyless calls then run as written, as
    #: under "optional", while a client key still replays. Read-only tools are never merged
    #: whatever this says (merging a read only makes it stale).
    derived: bool = True
    #: Seconds a completed record made under a derived key is kept.
    derived_retention: float = DEFAULT_DERIVED_RETENTION
    #: Seconds a claim stays valid without renewal; renewed every `lease / 3`.
    lease: float = DEFAULT_LEASE
    #: Seconds a keyed execution may run before it is cancelled; None: unbounded.
    max_run_time: float | None = DEFAULT_MAX_RUN_TIME
    #: What an expired lease means. None (auto): take over only when the tool is itself
    #: idempotent (`naturally_idempotent=True`, or the author's own `idempotentHint` /
    #: `readOnlyHint` annotation); otherwise the record turns UNKNOWN (-32012).
    takeover: bool | None = None
    #: The author declares that running the tool twice has no additional effect.
    naturally_idempotent: bool = False
    #: Exception types the author declares raised before any effect: the claim is released
    #: so a retry runs again. Every other exception is stored as an `isError` result.
    effect_free: tuple[type[Exception], ...] = ()
    #: Partition of the key space; default: authenticated principal + server name.
    scope: ScopeFn = field(default=default_scope)
    #: Seconds a duplicate waits for a running attempt before IN_PROGRESS (-32010). 0: no wait.
    wait: float = DEFAULT_WAIT
    #: Encoded results above this size are not kept; replays get an explanatory error result.
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    #: Store unreachable: False (default) refuses with -32013 and does not run the tool;
    #: True runs it unprotected and logs a warning.
    fail_open: bool = False
    #: Where a client that cannot write request `_meta` (a model filling tool arguments, the MCP
    #: Inspector, most agents) puts its key: an argument path, top level (`"idempotency_key"`)
    #: or nested with dots (`"meta.idempotency-key"`). The listed input schema gains it (required
    #: under `keys="required"`), with a description telling the model what to send; the tool's
    #: body gets it only if its own signature declares it; it never counts in the fingerprint.
    #: None (default): keys come from `_meta` only, and the listing is unchanged.
    key_argument: str | None = None
    #: The HTTP request header a key may come in on streamable HTTP (`"Idempotency-Key"`, as
    #: HTTP gateways and the IETF draft spell it). None (default): headers are ignored, so a
    #: header set by something the server does not trust to name calls changes nothing.
    key_header: str | None = None
    #: Which arguments make "the same call" when a key comes back (see `fingerprint.py`):
    #: `{"exclude": ["sent_at", "trace.id"]}` so a retry that changed only those replays,
    #: `{"include": ["order", "cents"]}` so only those count, or a function of the arguments.
    #: None (default): every argument counts. The key argument never does.
    fingerprint: FingerprintOption | None = None
    #: Called with a `Replay` (tool, age, executions, key source: never the key, the arguments
    #: or the result) each time a call is answered from its record. Runs inline; an exception
    #: from it is logged by type and swallowed, so a hook never breaks a call.
    on_replay: ReplayHook | None = None
    #: Asks the system of record what became of an execution whose outcome is unknown (rule 19,
    #: `reconcile.py`): one reconciler for every tool, or a mapping from tool name. Asked by a
    #: call that finds the record UNKNOWN (or its lease run out on a tool that may not be taken
    #: over), and by `mcp-once keys reconcile`. None (default): such calls get -32012.
    reconcile: ReconcileOption | None = None
    #: Seconds a reconciler may take; past them (or if it raises) its answer is `unknown`.
    reconcile_timeout: float = DEFAULT_RECONCILE_TIMEOUT

    def __post_init__(self) -> None:
        if self.keys not in KEY_MODES:
            raise ValueError(f"keys must be one of {', '.join(KEY_MODES)}; got {self.keys!r}")
        for name in ("retention", "derived_retention", "lease"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))
        if self.max_run_time is not None:
            object.__setattr__(self, "max_run_time", _positive("max_run_time", self.max_run_time))
        if isinstance(self.wait, bool) or not isinstance(self.wait, int | float):
            raise TypeError(f"wait must be a number of seconds, not {type(self.wait).__name__}")
        if not math.isfinite(self.wait) or self.wait < 0:
            raise ValueError(f"wait must be a finite number of seconds >= 0, not {self.wait!r}")
        object.__setattr__(self, "wait", float(self.wait))
        if not isinstance(self.derived, bool):
            raise TypeError(f"derived must be True or False, not {self.derived!r}")
        if self.takeover is not None and not isinstance(self.takeover, bool):
            raise TypeError("takeover must be True, False or None (auto)")
        object.__setattr__(self, "effect_free", _exception_types(self.effect_free))
        if not callable(self.scope):
            raise TypeError("scope must be a callable taking a CallScope and returning a str")
        if self.key_argument is not None:
            wire.argument_path(self.key_argument)
        if self.key_header is not None:
            check_header_name(self.key_header)
        if self.fingerprint is not None:
            check_option(self.fingerprint)
        wire.check_hook("on_replay", self.on_replay)
        if self.reconcile is not None:
            check_reconcile(self.reconcile)
        object.__setattr__(self, "reconcile_timeout", check_timeout(self.reconcile_timeout))
        size = self.max_result_bytes
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"max_result_bytes must be a positive int, not {size!r}")

    def takeover_for(self, declared_idempotent: bool) -> bool:
        """Whether an expired lease may be taken over for a tool whose author declared (or not)
        that it is idempotent by itself."""
        if self.takeover is not None:
            return self.takeover
        return self.naturally_idempotent or declared_idempotent

    def retention_for(self, derived: bool) -> float:
        return self.derived_retention if derived else self.retention

    def keyless_protected(self, caller_known: bool) -> bool:
        """Whether a keyless call can never run twice: refused, or deduplicated for its caller.

        Only then may a guarded tool be listed `idempotentHint: true` on the guard's behalf.
        """
        return self.keys == "required" or (self.keys == "derived" and caller_known)

    def retry_safe(self, caller_known: bool) -> bool:
        """Whether the listing may say `idempotentHint: true` on the guard's behalf: keyless
        calls cannot run twice, or any caller can send a key (an argument is in every client's
        reach, unlike request `_meta`), so a retry that repeats its key never runs twice."""
        return self.key_argument is not None or self.keyless_protected(caller_known)

    def advertised(self, caller_known: bool) -> dict[str, object]:
        """The tool definition's `_meta` entry: what the caller who lists may rely on."""
        keys = "optional" if self.keys == "derived" and not caller_known else self.keys
        entry: dict[str, object] = {"keys": keys, "retentionSeconds": int(self.retention)}
        # Added only when set, so a tool without these options is listed as it always was.
        if self.key_argument is not None:
            entry[wire.DEFINITION_KEY_ARGUMENT] = self.key_argument
        if self.key_header is not None:
            entry[wire.DEFINITION_KEY_HEADER] = self.key_header
        return entry


def make_policy(options: PolicyOptions) -> Policy:
    """A `Policy` from keyword options; `effect_free` may be one type or several."""
    unknown = set(options) - set(PolicyOptions.__annotations__)
    if unknown:
        raise TypeError(f"unknown idempotency option(s): {', '.join(sorted(unknown))}")
    kwargs: dict[str, Any] = dict(options)
    if "effect_free" in kwargs:
        kwargs["effect_free"] = _exception_types(kwargs["effect_free"])
    return Policy(**kwargs)
