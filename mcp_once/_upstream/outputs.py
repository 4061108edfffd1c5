"""Whether a result is one a caller's SDK accepts from a tool with an output schema.

The MCP SDK's client checks every result that is not an error against the tool's listed
`outputSchema` and raises `RuntimeError: Invalid structured content ...` for one that does not
match (the check `ClientSession.validate_tool_result` makes, with the validator the schema
names, `$ref`s within it). A stored result nobody ran (`mcp-once keys settle`) can be such a
result: each replay of it then breaks the caller, for as long as the record lives. Checked the
same way here, so that the proxy answers a replay of it with an error that says what to do
(`ProxyGuardMiddleware`) and `keys settle` refuses to store it where the proxy's listing is
known (`_cli/_keys.py`). No FastMCP here: `keys` runs without it. jsonschema (and what it stands on)
is imported at the first check, not with the proxy: it is not needed to start and list (issue
46, item 3).
"""

from __future__ import annotations

from typing import Any

#: Compiled validators by schema object (compiling costs far more than validating; the proxy
#: asks with the listed tool's own schema dict, the same object while the listing is unchanged).
#: Each entry holds its schema, so an id is never reused while it is cached. Cleared when full.
_validators: dict[int, tuple[dict[str, Any], Any]] = {}
_KEPT = 256


def _validator(schema: dict[str, Any]) -> Any:
    found = _validators.get(id(schema))
    if found is not None and found[0] is schema:
        return found[1]
    from jsonschema.validators import validator_for
    from referencing import Registry

    kind = validator_for(schema)
    kind.check_schema(schema)
    if len(_validators) >= _KEPT:
        _validators.clear()
    compiled = kind(schema, registry=Registry())
    _validators[id(schema)] = (schema, compiled)
    return compiled


def output_problem(
    schema: dict[str, Any] | None, structured: dict[str, Any] | None, *, is_error: bool
) -> str | None:
    """Why a caller's SDK would reject a result (its `structuredContent`, whether it is an
    error) from a tool listing `schema` as its output schema, in words; None when it would not
    (no schema, an error result, or a match)."""
    if schema is None or is_error:
        return None
    from jsonschema import SchemaError
    from jsonschema.exceptions import best_match
    from referencing.exceptions import Unresolvable

    if structured is None:
        return "it has no structuredContent, and the tool lists an output schema"
    try:
        validator = _validator(schema)
        if validator.is_valid(structured):  # the common case, without collecting errors
            return None
        error = best_match(validator.iter_errors(structured))
    except SchemaError as exc:
        return f"the tool's output schema is not valid JSON Schema ({exc.message})"
    except Unresolvable as exc:
        return f"the tool's output schema has a $ref that does not resolve ({exc})"
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path) or "the top level"
    return (
        f"its structuredContent does not match the tool's output schema at {where}: {error.message}"
    )
