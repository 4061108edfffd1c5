"""How a tool call is retried: limits, waits, and the knobs that open or close the gate.

The defaults are opinionated so that `RetryPolicy()` is safe to use as is: three attempts (the SRE
book's number, and the AWS SDKs'), one overall deadline that covers every attempt and every wait,
full-jitter exponential backoff (AWS "Full Jitter"), server retry hints honoured up to a cap, and a
shared retry budget so that a failing server is not hit with three times its load.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import tenacity

from idempotency import wire

from ._budget import RetryBudget
from ._hooks import GiveUpHook, RetryHook

#: Local correction of a server's annotations for one tool name.
#: "idempotent": retry after a maybe-executed failure even if the server does not say so.
#: "never": never retry once the tool may have run, whatever the server says. Failures that
#: provably never reached the server are still retried: they cannot duplicate an effect.
Override = Literal["idempotent", "never"]

#: Hard ceiling on attempts per call: more than this is a retry storm, not resilience.
MAX_ATTEMPTS_CEILING = 10

_OVERRIDES: frozenset[str] = frozenset({"idempotent", "never"})
_NO_RETRYING = tenacity.Retrying()


def _positive(name: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value!r}")
    return number


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Limits and waits for retrying one logical tool call.

    A policy is plain configuration and can be shared freely: by default each `RetryingSession`
    gets a budget of its own. Pass a `RetryBudget` instance to make sessions share one bucket.
    """

    #: Attempts per logical call, the first included. 1 disables retries; at most 10.
    max_attempts: int = 3
    #: Seconds for the whole call: every attempt, reconnection and wait. Never exceeded.
    deadline: float = 60.0
    #: Seconds one attempt may wait for its answer (clipped to what is left of the deadline);
    #: None lets a single attempt use the whole remaining deadline.
    attempt_timeout: float | None = None
    #: Full-jitter backoff: the wait before retry n is uniform in [0, min(wait_max,
    #: wait_initial * wait_exp_base ** (n - 1))].
    wait_initial: float = 0.1
    wait_max: float = 5.0
    wait_exp_base: float = 2.0
    #: Cap on a server's retry hint (HTTP Retry-After, `data.retryAfterMs`). A hint that does not
    #: fit in the remaining deadline ends the call at once instead of waiting it out for nothing.
    max_retry_after: float = 30.0
    #: Seconds one reconnection (the `connect` factory entering a new session) may take.
    connect_timeout: float = 10.0
    #: The retry budget: "per-session" gives each RetryingSession (one server) its own bucket;
    #: pass one RetryBudget to share it (several sessions to one server); None disables it
    #: (then only attempts and the deadline bound retries).
    budget: RetryBudget | Literal["per-session"] | None = "per-session"
    #: Per-tool-name corrections of the server's annotations, applied before them.
    overrides: Mapping[str, Override] = field(default_factory=dict, hash=False)
    #: False: ignore the server's idempotentHint/readOnlyHint (an untrusted server could claim
    #: anything); then only `overrides` can open the gate for maybe-executed failures.
    trust_annotations: bool = True
    #: Called with a `RetryEvent` (tool, failed attempt, failure kind, error, delay) when an
    #: attempt failed and another follows, before the wait. See `orchestrator._hooks`: inline,
    #: never awaited; an exception from it is logged by type and swallowed.
    on_retry: RetryHook | None = None
    #: Called with the `OutcomeUnknown` or `NotExecuted` about to be raised when retrying ends
    #: without a result (it carries the tool, the key, the attempts and the report), to count,
    #: alert or start a reconciliation. Same rules as `on_retry`.
    on_give_up: GiveUpHook | None = None

    _wait: tenacity.wait_random_exponential = field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise TypeError(f"max_attempts must be an int, not {type(attempts).__name__}")
        if not 1 <= attempts <= MAX_ATTEMPTS_CEILING:
            raise ValueError(
                f"max_attempts must be between 1 and {MAX_ATTEMPTS_CEILING}, got {attempts}"
            )
        _positive("deadline", self.deadline)
        if self.attempt_timeout is not None:
            _positive("attempt_timeout", self.attempt_timeout)
        initial = _positive("wait_initial", self.wait_initial, allow_zero=True)
        maximum = _positive("wait_max", self.wait_max, allow_zero=True)
        if maximum < initial:
            raise ValueError(f"wait_max ({maximum}) must be >= wait_initial ({initial})")
        base = _positive("wait_exp_base", self.wait_exp_base)
        if base < 1:
            raise ValueError(f"wait_exp_base must be >= 1, got {self.wait_exp_base!r}")
        _positive("max_retry_after", self.max_retry_after, allow_zero=True)
        _positive("connect_timeout", self.connect_timeout)
        if self.budget != "per-session" and not isinstance(self.budget, RetryBudget | None):
            kind = type(self.budget).__name__
            raise TypeError(f"budget must be a RetryBudget, 'per-session' or None, not {kind}")
        if not isinstance(self.trust_annotations, bool):
            raise TypeError("trust_annotations must be a bool")
        wire.check_hook("on_retry", self.on_retry)
        wire.check_hook("on_give_up", self.on_give_up)
        object.__setattr__(self, "overrides", MappingProxyType(check_overrides(self.overrides)))
        object.__setattr__(
            self,
            "_wait",
            tenacity.wait_random_exponential(multiplier=initial, max=maximum, exp_base=base),
        )

    def backoff(self, retry_number: int) -> float:
        """Seconds to wait before retry `retry_number` (1 = the wait after the first attempt)."""
        if self.wait_max == 0:
            return 0.0
        state = tenacity.RetryCallState(_NO_RETRYING, None, (), {})
        state.attempt_number = max(1, retry_number)
        return float(self._wait(state))

    def clamp_hint(self, hint: float) -> float:
        """A server's retry hint, made safe: never negative, never above `max_retry_after`."""
        return min(max(0.0, hint), self.max_retry_after)


def check_overrides(overrides: object) -> dict[str, Override]:
    """Validate a mapping of tool name -> "idempotent" | "never" and return a private copy."""
    if not isinstance(overrides, Mapping):
        raise TypeError(f"overrides must be a mapping, not {type(overrides).__name__}")
    checked: dict[str, Override] = {}
    for name, value in overrides.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"override keys must be non-empty tool names, got {name!r}")
        if value not in _OVERRIDES:
            raise ValueError(
                f"override for tool {name!r} must be 'idempotent' or 'never', got {value!r}"
            )
        checked[name] = value
    return checked
