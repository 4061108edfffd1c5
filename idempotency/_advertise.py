"""What a guarded tool's definition tells clients, merged into what its author wrote.

`idempotentHint: true` is what opens a careful client's retry gate; the `_meta` entry says how
keys are handled and for how long results are kept. Authors write neither by hand.
"""

from __future__ import annotations

from typing import Any

from mcp_types import Tool, ToolAnnotations

from . import wire
from ._policy import Policy


def declares_idempotent(annotations: ToolAnnotations | None) -> bool:
    """Whether the author declared the tool safe to run twice (read-only implies it)."""
    if annotations is None:
        return False
    return annotations.idempotent_hint is True or annotations.read_only_hint is True


def advertise_annotations(annotations: ToolAnnotations | None) -> ToolAnnotations:
    if annotations is None:
        return ToolAnnotations(idempotent_hint=True)
    if annotations.read_only_hint is True:
        return annotations  # read-only already promises more than idempotent
    return annotations.model_copy(update={"idempotent_hint": True})


def advertise_meta(meta: dict[str, Any] | None, policy: Policy) -> dict[str, Any]:
    return {**(meta or {}), wire.IDEMPOTENCY_META: policy.advertised()}


def advertise_tool(tool: Tool, policy: Policy) -> Tool:
    """A listed (low-level) tool definition with the guard's annotations and `_meta` merged in."""
    return tool.model_copy(
        update={
            "annotations": advertise_annotations(tool.annotations),
            "meta": advertise_meta(tool.meta, policy),
        }
    )
