"""FastMCP's answers in the guard's terms and back: results, errors, and what happened before
the tool's body.

The guard stores and replays `CallToolResult`s (domain form). FastMCP's middleware chain carries
`ToolResult`s and signals failures by raising. This module is the whole translation:

- a `ToolResult` becomes the `CallToolResult` FastMCP itself would put on the wire, and a guard
  answer goes back as a `ToolResult` that keeps that exact wire form (`from_mcp_result`), so a
  replay is byte-identical to the first answer;
- an input-required round (SEP-2322) passes through as the guard's `InputRequiredResult`, never
  stored;
- an exception from further down the chain is judged: raised before FastMCP entered the tool
  (another middleware, auth, lookup: see `body.py`), refused before the body ran (unknown,
  disabled or unauthorized tool, invalid arguments) or failed with an error the author declared
  effect-free → `NothingDone` (released, re-raised as FastMCP raised it); cut short by the tool's
  own `timeout=`, or a tool that raised `Interrupted` itself (a proxy whose upstream link broke
  mid-call) → `Interrupted` (OUTCOME_UNKNOWN, never a stored "timed out"); anything else
  happened in or after the body and is stored as FastMCP renders it (`error_result`). A failure
  of an inner middleware *after* the body ran is stored too: the effect may have happened, so a
  retry must not run it again.
"""

from __future__ import annotations

from fastmcp.exceptions import (
    AuthorizationError,
    DisabledError,
    FastMCPError,
    NotFoundError,
    ToolError,
    ValidationError,
)
from fastmcp.tools.base import InputRequiredToolResult, ToolResult
from mcp import MCPError
from mcp_types import CallToolResult, InputRequiredResult, TextContent
from pydantic import ValidationError as PydanticValidationError

from ..._guard.guard import Interrupted, NothingDone
from ..._guard.guard import ToolResult as GuardResult
from ..lowlevel import generic_error_result

#: How pydantic itself sets a model's state (`as_tool_result`), past its `__setattr__`.
_set = object.__setattr__

#: The code of the `MCPError` FastMCP raises when a tool outlives its `timeout=` (and then wraps
#: in a `ToolError`); its message says "execution timed out after".
_TIMEOUT_CODE = -32000
_TIMEOUT_TEXT = "execution timed out after"


def to_guard(result: object) -> GuardResult:
    """What FastMCP's chain returned, as the guard stores it (or passes an input round on)."""
    if isinstance(result, InputRequiredToolResult):
        return result.input_required
    if not isinstance(result, ToolResult):
        raise TypeError(f"the FastMCP middleware chain returned {type(result).__name__}")
    return as_call_tool_result(result)


def as_call_tool_result(result: ToolResult) -> CallToolResult:
    """The `CallToolResult` FastMCP puts on the wire for `result` (its `tools/call` handler's
    conversion): `as_tool_result`'s way back. Public as `idempotency.fastmcp.as_call_tool_result`.

    A result that keeps its wire form (`as_tool_result`, `ToolResult.from_mcp_result`) gives it
    as it is, read from pydantic's store of private attributes: `ToolResult.to_mcp_result`
    reads it through pydantic's `__getattr__`, twice, ~3 µs a read (pydantic tries the private
    attribute's descriptor first, a raised and caught `AttributeError`)."""
    if type(result).to_mcp_result is ToolResult.to_mcp_result:  # not a subclass's own
        private = result.__pydantic_private__
        kept = None if private is None else private.get("_raw_mcp_result")
        if isinstance(kept, CallToolResult):
            return kept
    wire = result.to_mcp_result()
    if isinstance(wire, CallToolResult):
        return wire
    if isinstance(wire, tuple):
        content, structured = wire
        return CallToolResult(content=content, structured_content=structured)
    return CallToolResult(content=wire)


def as_tool_result(answer: GuardResult) -> ToolResult:
    """A `CallToolResult` (or an input-required round) already checked against the wire schema,
    as the `ToolResult` a FastMCP tool or middleware returns, its wire form kept exactly. The
    guard answers FastMCP with it; a proxy tool can return an upstream's result with it
    (`mcp_once.proxy`). Public as `idempotency.fastmcp.as_tool_result`.

    What `ToolResult.from_mcp_result` makes, without its constructor's conversions (a tool's
    return values into content blocks, the structured content through pydantic's JSON dump): a
    stored or first answer is a `CallToolResult` already, its structured content JSON, so they
    would only copy it, a walk of the whole structured content on every call (~50 µs for 6 KB;
    benchmarks/README.md, issue 46). The wire form is kept where `from_mcp_result` keeps it
    (`tests/server/test_server_units.py` holds the two the same).

    Built as `ToolResult.model_construct` builds a model, with the wire form in its private
    attributes at once: `model_construct` and then setting `_raw_mcp_result` went through
    pydantic's private-attribute set-up and `__setattr__`, 5.2 µs against 1.4 µs here, and a
    guarded proxy call makes two (issue 46). The same test holds this state equal to
    `model_construct`'s."""
    if isinstance(answer, InputRequiredResult):
        return InputRequiredToolResult(answer)
    wrapped = ToolResult.__new__(ToolResult)
    fields = {
        "content": answer.content,
        "structured_content": answer.structured_content,
        "meta": answer.meta,
        "is_error": answer.is_error,
    }
    _set(wrapped, "__dict__", fields)
    _set(wrapped, "__pydantic_fields_set__", set(fields))
    _set(wrapped, "__pydantic_extra__", None)
    _set(wrapped, "__pydantic_private__", {"_raw_mcp_result": answer})
    return wrapped


def error_result(tool: str, exc: Exception) -> CallToolResult:
    """The `isError` result FastMCP makes of an exception that reaches its tools/call handler:
    its own errors as their text (already masked by FastMCP where it masks), anything else as
    the generic error the low-level handler stores."""
    if isinstance(exc, FastMCPError):
        return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
    return generic_error_result(tool, exc)


def _causes(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    cause = exc.__cause__
    while cause is not None and cause not in found:
        found.append(cause)
        cause = cause.__cause__
    return found


def _timed_out(exc: ToolError) -> bool:
    return any(
        isinstance(cause, MCPError)
        and cause.error.code == _TIMEOUT_CODE
        and _TIMEOUT_TEXT in cause.error.message
        for cause in _causes(exc)
    )


def judged(
    exc: Exception, effect_free: tuple[type[Exception], ...], *, body_started: bool
) -> Exception:
    """What `execute` raises for `exc`, raised by FastMCP's chain below the guard
    (`body_started`: whether FastMCP entered the tool before it was raised)."""
    for raised in (exc, *_causes(exc)):
        if isinstance(raised, Interrupted):
            return raised  # the tool itself says it may have had its effect: never stored
    if not body_started or isinstance(exc, NotFoundError | DisabledError | AuthorizationError):
        return NothingDone(exc)
    if isinstance(exc, ValidationError) and isinstance(exc.__cause__, PydanticValidationError):
        return NothingDone(exc)  # the arguments failed validation: the body never started
    if isinstance(exc, PydanticValidationError):
        # A tool class validating its own arguments (FastMCP keeps this path "for backward
        # compatibility", logs it as invalid arguments and answers -32602): a refusal.
        return NothingDone(exc)
    if isinstance(exc, ToolError):
        if _timed_out(exc):
            return Interrupted("it ran longer than the timeout FastMCP enforces for this tool")
        if any(isinstance(cause, effect_free) for cause in _causes(exc)):
            return NothingDone(exc)
    return exc
