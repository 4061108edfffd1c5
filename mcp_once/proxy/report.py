"""What the proxy does with each upstream tool, and why: the rows of `mcp-once tools`.

The tool-annotations advice made runnable: a hint is a boolean, a key is a guarantee. Each row
says the upstream's annotations, what the proxy does (guarded, passed through as read-only, set by
the policy), what the policy's guard options change for it (`effects`: `keys`, `key_argument`,
`key_header`, `retention`, `max_run_time`, `fingerprint`, each in words), what a retrying client
may do through the proxy, and what looks wrong: annotations that contradict each other (read-only
and destructive; destructive and idempotent with no key place) and tools with no annotations at
all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mcp_types import Tool

from idempotency import Policy

from .policy import ProxyPolicy, ToolPolicy

_HINTS = (
    ("readOnly", "read_only_hint"),
    ("destructive", "destructive_hint"),
    ("idempotent", "idempotent_hint"),
    ("openWorld", "open_world_hint"),
)


@dataclass(frozen=True, slots=True)
class ToolRow:
    name: str
    #: The upstream's hints as listed (absent ones left out).
    annotations: dict[str, bool]
    #: "guarded" or "pass-through".
    action: str
    why: str
    retry: str
    flags: list[str] = field(default_factory=list)
    #: What the policy's guard options change for this tool, one sentence each.
    effects: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _hints(tool: Tool) -> dict[str, bool]:
    found: dict[str, bool] = {}
    annotations = tool.annotations
    if annotations is None:
        return found
    for label, attribute in _HINTS:
        value = getattr(annotations, attribute, None)
        if isinstance(value, bool):
            found[label] = value
    return found


def _seconds(value: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if value >= size and value % size == 0:
            return f"{value:g} s ({value / size:g} {unit})"
    return f"{value:g} s"


#: What each guard option does, in words, by its value (`effects`).
_KEYS = {
    "required": "a call without a key is refused (-32602), never run unguarded",
    "optional": "a call without a key runs unguarded (no record, no replay)",
    "derived": "a keyless re-send from the same caller is answered from the first call's record",
}


def effects(rule: ToolPolicy, guarded: bool) -> list[str]:
    """What the policy's guard options change for a tool, each in words (the options it does not
    set stay the guard's defaults); for a tool that passes through, that they change nothing."""
    options = rule.options
    if not options:
        return []
    if not guarded:
        return [f"{', '.join(sorted(options))} set, unused: the tool passes through"]
    found: list[str] = []
    if "keys" in options:
        found.append(f"keys = {options['keys']}: {_KEYS[options['keys']]}")
    if options.get("key_argument"):
        found.append(
            f"key_argument = {options['key_argument']}: a key may come in that argument (added"
            " to the listed input schema, never in the fingerprint)"
        )
    if options.get("key_header"):
        found.append(f"key_header = {options['key_header']}: a key may come in that HTTP header")
    if "retention" in options:
        found.append(
            f"retention = {_seconds(options['retention'])}: a keyed answer is replayed that long"
            f" (default {_seconds(Policy().retention)})"
        )
    if "max_run_time" in options:
        limit = options["max_run_time"]
        found.append(
            "max_run_time = none: a call may run unbounded"
            if limit is None
            else f"max_run_time = {_seconds(limit)}: a call still running then is cut short and"
            f" answered -32012 (default {_seconds(Policy().max_run_time or 0)})"
        )
    if options.get("fingerprint") is not None:
        found.append(
            f"fingerprint = {options['fingerprint']}: only these arguments make the same call"
            " for a reused key"
        )
    return found


def row(tool: Tool, policy: ProxyPolicy) -> ToolRow:
    """One tool's row."""
    hints = _hints(tool)
    rule = policy.for_tool(tool.name)
    read_only = hints.get("readOnly", False)
    guarded = rule.guarded(read_only)
    if rule.guard is not None:
        why = f"set by the policy ({', '.join(rule.set_by)})"
    elif read_only:
        why = "passed through as read-only (the upstream lists readOnlyHint)"
    else:
        why = "guarded: not listed read-only"
    if guarded:
        retry = "re-send with the same key: the proxy replays, never runs it twice"
        if rule.upstream_idempotent:
            retry += "; the proxy itself re-sends it to the upstream after a broken call"
    elif read_only:
        retry = "retry freely (a read)"
    else:
        retry = "do not retry blindly: nothing deduplicates it"
    flags: list[str] = []
    if not hints:
        flags.append("no annotations at all")
    if read_only and hints.get("destructive"):
        flags.append("readOnlyHint and destructiveHint contradict each other")
    key_place = rule.options.get("key_argument") or rule.options.get("key_header")
    if hints.get("destructive") and hints.get("idempotent") and not key_place:
        flags.append("destructive and idempotent, with no key place: a hint is not a guarantee")
    action = "guarded" if guarded else "pass-through"
    return ToolRow(tool.name, hints, action, why, retry, flags, effects(rule, guarded))


def rows(tools: Sequence[Tool], policy: ProxyPolicy) -> list[ToolRow]:
    return [row(t, policy) for t in tools]


def table(found: Sequence[ToolRow]) -> str:
    """The rows as a plain-text table (one line per tool, flags on lines of their own)."""
    lines = [f"{'TOOL':<28} {'ANNOTATIONS':<34} {'PROXY':<13} WHY / RETRY"]
    for r in found:
        hints = ",".join(k for k, v in r.annotations.items() if v) or "-"
        lines.append(f"{r.name:<28} {hints:<34} {r.action:<13} {r.why}")
        lines.append(f"{'':<77} retry: {r.retry}")
        lines.extend(f"{'':<77} policy: {effect}" for effect in r.effects)
        lines.extend(f"{'':<77} ! {flag}" for flag in r.flags)
    return "\n".join(lines)
