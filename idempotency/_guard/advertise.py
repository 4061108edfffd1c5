"""What a guarded tool's definition tells clients, merged into what its author wrote.

`idempotentHint: true` is what opens a generic client's retry gate, so the guard adds it only
where a keyless call really cannot run twice *for the caller who lists the tools*: keys are
required, or derived for a caller the server can tell apart (`Policy.keyless_protected`).
Elsewhere the author's own annotation stands, and the `_meta` entry says `keys: "optional"`: a key
the client sends is still honoured, which is what mcp-once's own client looks for. Authors write
neither by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, Self, TypeVar

from mcp_types import ToolAnnotations

from .. import wire
from .keyplaces import schema_with_key
from .policy import Policy


def declares_idempotent(annotations: ToolAnnotations | None) -> bool:
    """Whether the author declared the tool safe to run twice (read-only implies it)."""
    if annotations is None:
        return False
    return annotations.idempotent_hint is True or annotations.read_only_hint is True


def derivable(policy: Policy, annotations: ToolAnnotations | None, opted_out: bool) -> bool:
    """Whether a keyless call of a tool may be merged under a derived key: not when the policy
    turns derivation off or the tool was opted out (every call meant to be new), and never for
    a read-only tool (merging a read only makes it stale). A client key replays regardless."""
    if not policy.derived or opted_out:
        return False
    return not (annotations is not None and annotations.read_only_hint is True)


def advertise_annotations(
    annotations: ToolAnnotations | None, policy: Policy, caller_known: bool
) -> ToolAnnotations | None:
    if not policy.retry_safe(caller_known):
        return annotations
    if annotations is None:
        return ToolAnnotations(idempotent_hint=True)
    if annotations.read_only_hint is True:
        return annotations  # read-only already promises more than idempotent
    return annotations.model_copy(update={"idempotent_hint": True})


def advertise_meta(
    meta: dict[str, Any] | None, policy: Policy, caller_known: bool
) -> dict[str, Any]:
    return {**(meta or {}), wire.IDEMPOTENCY_META: policy.advertised(caller_known)}


def advertise_schema(schema: dict[str, Any], policy: Policy) -> dict[str, Any]:
    """The tool's input schema with the key argument in it; `schema` itself (untouched) when the
    policy names none, so such a tool is listed byte for byte as its framework lists it."""
    if policy.key_argument is None:
        return schema
    return schema_with_key(schema, policy.key_argument, required=policy.keys == "required")


class ToolDefinition(Protocol):
    """A tool definition as the SDK (`mcp_types.Tool`) or a framework (FastMCP's `Tool`) lists it:
    a pydantic model with annotations and a `_meta` mapping."""

    annotations: ToolAnnotations | None
    meta: dict[str, Any] | None

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> Self: ...


D = TypeVar("D", bound=ToolDefinition)


def advertise_tool(tool: D, policy: Policy, caller_known: bool) -> D:
    """A listed tool definition with the guard's annotations and `_meta` merged in."""
    return tool.model_copy(
        update={
            "annotations": advertise_annotations(tool.annotations, policy, caller_known),
            "meta": advertise_meta(tool.meta, policy, caller_known),
        }
    )
