"""May a failure after which the tool may have run be retried?

Only when running the tool again is harmless and a key travels with the call: the tool says it is
idempotent (or read-only, which the MCP spec defines as having no effects), or its definition
carries mcp-once's `_meta` entry, by which the server promises to keep an idempotency record for
every keyed call (whatever it does with keyless ones: a guarded server lists the author's own
annotations to a caller whose keyless calls it cannot deduplicate, and the key this client
attaches is what makes the retry safe). The user has the last word per tool
name (overrides), and can refuse to trust a server's annotations altogether.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mcp_types import Tool

from idempotency import wire

from ._policy import Override
from ._report import FailureKind

#: Failures whose retry goes through the gate. "never_sent" does not: nothing can be duplicated.
GATED: frozenset[FailureKind] = frozenset({"maybe_executed", "in_progress", "store_unavailable"})


@dataclass(frozen=True, slots=True)
class GateDecision:
    open: bool
    #: Why, in words (for logs and debugging).
    because: str


def annotated_safe(tool: Tool | None) -> bool:
    """Whether the tool's annotations say a second run is harmless."""
    if tool is None or tool.annotations is None:
        return False
    return tool.annotations.idempotent_hint is True or tool.annotations.read_only_hint is True


def keeps_records(tool: Tool | None) -> bool:
    """Whether the tool's server advertises idempotency records for keyed calls of it."""
    entry = (tool.meta or {}).get(wire.IDEMPOTENCY_META) if tool is not None else None
    return isinstance(entry, Mapping) and entry.get("keys") in wire.KEY_MODES


def retry_gate(
    kind: FailureKind,
    *,
    tool_name: str,
    tool: Tool | None,
    overrides: Mapping[str, Override],
    trust_annotations: bool,
    key_attached: bool,
) -> GateDecision:
    """Decide whether this kind of failure may be retried for this tool (limits aside)."""
    if kind == "permanent":
        return GateDecision(False, "permanent errors are never retried")
    if kind not in GATED:
        return GateDecision(True, "the request never reached the server")
    if not key_attached:
        return GateDecision(False, "no idempotency key travels with the call")
    override = overrides.get(tool_name)
    if override == "never":
        return GateDecision(False, f"override: tool {tool_name!r} is never retried once sent")
    if override == "idempotent":
        return GateDecision(True, f"override: tool {tool_name!r} is idempotent")
    if not trust_annotations:
        return GateDecision(False, "server annotations are not trusted and no override opens it")
    if tool is None:
        return GateDecision(False, f"tool {tool_name!r} is not in the server's tool list")
    if annotated_safe(tool):
        return GateDecision(True, "the tool is annotated idempotentHint or readOnlyHint")
    if keeps_records(tool):
        return GateDecision(True, "the server keeps an idempotency record for keyed calls")
    return GateDecision(
        False, "the tool is not annotated idempotentHint or readOnlyHint, nor advertised as keyed"
    )
