"""What to break: the fault kinds and the seeded plan that picks one per request.

A plan is plain data (frozen, JSON round-trippable) so that a failing chaos run can be replayed
exactly from its seed and its plan, and so that a plan can live in a file next to a test report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields
from enum import StrEnum
from types import MappingProxyType
from typing import Any

__all__ = ["Fault", "FaultPlan"]

_TOOLS_CALL = "tools/call"


class Fault(StrEnum):
    """One way a link can fail a single request.

    The declaration order is part of a run's reproducibility: it is the order in which the
    cumulative probabilities are laid out on [0, 1) for the seeded draw.
    """

    LOST_ACK = "lost_ack"
    """The server gets and handles the request; its response is swallowed (the effect happened)."""
    DROP_REQUEST = "drop_request"
    """The request is swallowed before the server sees it (no effect)."""
    DELAY_REQUEST = "delay_request"
    """The request reaches the server late; messages behind it wait (FIFO, never reordered)."""
    DELAY_RESPONSE = "delay_response"
    """The response reaches the client late; messages behind it wait."""
    DUPLICATE = "duplicate"
    """The request reaches the server twice; the client sees only the first copy's answer."""
    CLOSE_BEFORE_WRITE = "close_before_write"
    """The link dies as the client writes the request: the write fails, the server sees nothing."""
    CLOSE_AFTER_WRITE = "close_after_write"
    """The request is delivered, then the link dies: whether it ran is unknown to the client."""


_PROBABILITY_FIELDS: tuple[str, ...] = tuple(kind.value for kind in Fault)
_SUM_TOLERANCE = 1e-9


def _probability(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"FaultPlan.{name} must be a number in [0, 1], got {value!r}")
    number = float(value)
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise ValueError(f"FaultPlan.{name} must be in [0, 1], got {value!r}")
    return number


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"FaultPlan.{name} must be a number of seconds, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0.0:
        raise ValueError(f"FaultPlan.{name} must be a finite number >= 0, got {value!r}")
    return number


def _names(name: str, value: object, *, allow_none: bool) -> frozenset[str] | None:
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"FaultPlan.{name} must be a collection of strings, got None")
    # A bare string is iterable too; taking it as a set of characters would silently match nothing.
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(
            f"FaultPlan.{name} must be a collection of strings (not a single string), got {value!r}"
        )
    items = list(value)
    bad = [item for item in items if not isinstance(item, str) or not item]
    if bad:
        raise TypeError(f"FaultPlan.{name} must hold non-empty strings, got {bad[0]!r}")
    if not items:
        hint = " (use None to match every tool)" if allow_none else ""
        raise ValueError(f"FaultPlan.{name} must not be empty{hint}")
    return frozenset(items)


def _fault_or_none(index: int, value: object) -> Fault | None:
    if value is None or isinstance(value, Fault):
        return value
    if isinstance(value, str):
        try:
            return Fault(value)
        except ValueError:
            pass
    choices = ", ".join(kind.value for kind in Fault)
    raise ValueError(
        f"FaultPlan.schedule[{index}] must be a Fault ({choices}) or None, got {value!r}"
    )


def _schedule_index(key: object) -> int:
    if isinstance(key, str) and key.isdecimal():  # JSON object keys are strings
        key = int(key)
    if isinstance(key, bool) or not isinstance(key, int):
        raise TypeError(f"FaultPlan.schedule keys must be request ordinals (int >= 1), got {key!r}")
    if key < 1:
        raise ValueError(f"FaultPlan.schedule keys are 1-based request ordinals, got {key!r}")
    return key


def _schedule(value: object) -> Mapping[int, Fault | None]:
    if not isinstance(value, Mapping):
        raise TypeError(
            f"FaultPlan.schedule must be a mapping of request ordinal to Fault, got {value!r}"
        )
    entries: dict[int, Fault | None] = {}
    for key, kind in value.items():
        index = _schedule_index(key)
        if index in entries:
            raise ValueError(f"FaultPlan.schedule names request {index} twice")
        entries[index] = _fault_or_none(index, kind)
    return MappingProxyType(dict(sorted(entries.items())))


@dataclass(frozen=True)
class FaultPlan:
    """Per-request fault probabilities plus an explicit schedule that overrides them.

    Only requests whose method is in `methods` (and, for `tools/call`, whose tool is in `tools`
    when that is set) are *matching*; they are numbered 1, 2, 3, ... in the order the client writes
    them, across every connection of one `Chaos`. For each matching request the seeded RNG draws
    exactly two numbers (which fault, how long a delay), whatever the outcome, so a schedule entry
    never shifts the random choices for the requests after it. `schedule[n]` forces request `n`'s
    fault; `None` forces a clean pass.
    """

    lost_ack: float = 0.0
    drop_request: float = 0.0
    delay_request: float = 0.0
    delay_response: float = 0.0
    duplicate: float = 0.0
    close_before_write: float = 0.0
    close_after_write: float = 0.0
    schedule: Mapping[int, Fault | None] = field(default_factory=dict)
    methods: AbstractSet[str] = frozenset({_TOOLS_CALL})
    tools: AbstractSet[str] | None = None
    delay_min_seconds: float = 0.01
    delay_max_seconds: float = 0.1

    def __post_init__(self) -> None:
        total = 0.0
        for name in _PROBABILITY_FIELDS:
            value = _probability(name, getattr(self, name))
            object.__setattr__(self, name, value)
            total += value
        if total > 1.0 + _SUM_TOLERANCE:
            raise ValueError(f"FaultPlan probabilities must sum to at most 1, got {total:g}")
        object.__setattr__(self, "schedule", _schedule(self.schedule))
        object.__setattr__(self, "methods", _names("methods", self.methods, allow_none=False))
        object.__setattr__(self, "tools", _names("tools", self.tools, allow_none=True))
        low = _seconds("delay_min_seconds", self.delay_min_seconds)
        high = _seconds("delay_max_seconds", self.delay_max_seconds)
        if low > high:
            raise ValueError(
                f"FaultPlan.delay_min_seconds ({low:g}) exceeds delay_max_seconds ({high:g})"
            )
        object.__setattr__(self, "delay_min_seconds", low)
        object.__setattr__(self, "delay_max_seconds", high)

    def __hash__(self) -> int:
        return hash(
            (
                *(getattr(self, name) for name in _PROBABILITY_FIELDS),
                tuple(self.schedule.items()),
                self.methods,
                self.tools,
                self.delay_min_seconds,
                self.delay_max_seconds,
            )
        )

    def probability(self, kind: Fault) -> float:
        """The drawn probability of `kind` for a matching request that the schedule leaves alone."""
        value: float = getattr(self, kind.value)
        return value

    def matches(self, method: str, tool: str | None) -> bool:
        """Whether a request is subject to this plan (and so consumes an ordinal and two draws)."""
        if method not in self.methods:
            return False
        return method != _TOOLS_CALL or self.tools is None or tool in self.tools

    def choose(self, index: int, draw: float) -> Fault | None:
        """The fault for matching request `index` given a uniform `draw` in [0, 1)."""
        if index in self.schedule:
            return self.schedule[index]
        edge = 0.0
        for kind in Fault:
            edge += self.probability(kind)
            if draw < edge:
                return kind
        return None

    def delay(self, draw: float) -> float:
        """A delay in [delay_min_seconds, delay_max_seconds] from a uniform `draw` in [0, 1)."""
        return self.delay_min_seconds + draw * (self.delay_max_seconds - self.delay_min_seconds)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; `FaultPlan.from_dict(plan.to_dict()) == plan`."""
        data: dict[str, Any] = {name: getattr(self, name) for name in _PROBABILITY_FIELDS}
        data["schedule"] = {
            str(index): None if kind is None else kind.value
            for index, kind in self.schedule.items()
        }
        data["methods"] = sorted(self.methods)
        data["tools"] = None if self.tools is None else sorted(self.tools)
        data["delay_min_seconds"] = self.delay_min_seconds
        data["delay_max_seconds"] = self.delay_max_seconds
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultPlan:
        """Rebuild a plan from `to_dict()` output (e.g. after JSON); absent keys take defaults."""
        if not isinstance(data, Mapping):
            raise TypeError(f"FaultPlan.from_dict expects a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(key) for key in data if key not in known)
        if unknown:
            raise ValueError(f"FaultPlan.from_dict got unknown keys: {', '.join(unknown)}")
        return cls(**dict(data))
