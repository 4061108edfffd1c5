"""The proxy's policy file (`--policy FILE`, TOML): per tool name or glob, how the guard treats it.

A server's annotations are untrusted (the MCP spec says so), so the operator overrides them here:

```toml
[tools."create_*"]
keys = "required"
key_argument = "request_id"

[tools."search"]
guard = false                # pass through: the proxy never stores or merges it

[tools."set_status"]
upstream_idempotent = true   # the upstream tool may run twice: re-sent after a maybe-executed
                             # failure, and an expired lease is taken over
```

Every table applies to the tools its name matches (`fnmatch` globs); where several match, an exact
name wins over globs, and among globs the later table wins key by key. A key this module does not
know, or a value the guard would refuse (`keys = "mandatory"`, `retention = "1d"`), is an error
that names its table, raised as the file is read: `mcp-once proxy` and `mcp-once tools` both read
it with `load_policy`, so a policy `tools` accepts is one the proxy starts with. A pattern that
matches no tool of the upstream is reported with the nearest tool name (`unmatched_said`).
"""

from __future__ import annotations

import difflib
import fnmatch
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from idempotency import Policy, PolicyOptions

#: The guard options a table may set (each as `IdempotencyMiddleware` takes it).
GUARD_KEYS = frozenset(
    {"keys", "key_argument", "key_header", "fingerprint", "retention", "max_run_time"}
)
#: Every key a `[tools."<name>"]` table may hold.
TOOL_KEYS = GUARD_KEYS | {"guard", "upstream_idempotent"}


class PolicyError(ValueError):
    """The policy file cannot be applied as written (unknown key, wrong type, bad TOML)."""


@dataclass(frozen=True, slots=True)
class ToolRule:
    """One `[tools."<pattern>"]` table."""

    pattern: str
    #: None: the default (guard unless the upstream lists the tool read-only).
    guard: bool | None = None
    upstream_idempotent: bool | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.pattern)

    @property
    def exact(self) -> bool:
        return not any(c in self.pattern for c in "*?[")


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """What the proxy does with one tool, the policy's tables merged."""

    #: None: guard unless the upstream lists it read-only.
    guard: bool | None = None
    upstream_idempotent: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The patterns that set anything for this tool (for `mcp-once tools`' "why").
    set_by: tuple[str, ...] = ()

    def guarded(self, read_only: bool) -> bool:
        """Whether calls of the tool run under the guard: as the policy says, else every tool
        the upstream does not list as read-only (a read needs no record)."""
        return self.guard if self.guard is not None else not read_only

    def guard_options(self) -> PolicyOptions:
        """The options of this tool's guard; `upstream_idempotent` decides lease takeover
        (the upstream's own `idempotentHint` is not trusted for that)."""
        options: dict[str, Any] = dict(self.options)
        options["takeover"] = self.upstream_idempotent
        return options  # type: ignore[return-value]  # keys checked against GUARD_KEYS


@dataclass(frozen=True, slots=True)
class ProxyPolicy:
    """The whole policy file: its rules in file order."""

    rules: tuple[ToolRule, ...] = ()

    def for_tool(self, name: str) -> ToolPolicy:
        matching = [r for r in self.rules if r.matches(name)]
        # Globs first, then exact names, so an exact table has the last word.
        ordered = [r for r in matching if not r.exact] + [r for r in matching if r.exact]
        guard: bool | None = None
        idempotent = False
        options: dict[str, Any] = {}
        for rule in ordered:
            if rule.guard is not None:
                guard = rule.guard
            if rule.upstream_idempotent is not None:
                idempotent = rule.upstream_idempotent
            options.update(rule.options)
        return ToolPolicy(guard, idempotent, options, tuple(r.pattern for r in ordered))

    def unmatched(self, names: Iterable[str]) -> list[str]:
        """Patterns that match none of `names` (a typo shows)."""
        listed = list(names)
        return [r.pattern for r in self.rules if not any(r.matches(n) for n in listed)]

    def unmatched_said(self, names: Iterable[str]) -> list[str]:
        """A sentence per pattern that matches none of `names`, with the nearest name where
        one is close (`difflib`): what `mcp-once tools` prints and the proxy logs."""
        listed = list(names)
        said = []
        for pattern in self.unmatched(listed):
            sentence = f"policy pattern {pattern!r} matches no tool of the upstream"
            nearest = difflib.get_close_matches(pattern, listed, n=1, cutoff=0.6)
            if nearest:
                sentence += f"; did you mean {nearest[0]!r}?"
            said.append(sentence)
        return said


def _flag(pattern: str, key: str, value: object) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise PolicyError(f'[tools."{pattern}"] {key} must be true or false, not {value!r}')
    return value


def parse_policy(data: Mapping[str, Any]) -> ProxyPolicy:
    """A `ProxyPolicy` from the parsed TOML; `PolicyError` naming the first thing wrong."""
    unknown = set(data) - {"tools"}
    if unknown:
        raise PolicyError(f"unknown policy key(s): {', '.join(sorted(unknown))} (only [tools.*])")
    tools = data.get("tools", {})
    if not isinstance(tools, Mapping):
        raise PolicyError('"tools" must be a table of [tools."<name or glob>"] tables')
    rules: list[ToolRule] = []
    for pattern, table in tools.items():
        if not isinstance(table, Mapping):
            raise PolicyError(f'[tools."{pattern}"] must be a table')
        bad = set(table) - TOOL_KEYS
        if bad:
            raise PolicyError(
                f'unknown policy key(s) in [tools."{pattern}"]: {", ".join(sorted(bad))}'
                f" (known: {', '.join(sorted(TOOL_KEYS))})"
            )
        options = {k: v for k, v in table.items() if k in GUARD_KEYS}
        _check_options(pattern, options)
        guard = _flag(pattern, "guard", table.get("guard"))
        idempotent = _flag(pattern, "upstream_idempotent", table.get("upstream_idempotent"))
        rules.append(ToolRule(pattern, guard, idempotent, options))
    return ProxyPolicy(tuple(rules))


def _check_options(pattern: str, options: Mapping[str, Any]) -> None:
    """The table's guard options as the guard checks them (`Policy`): each option is checked on
    its own there, so a table that passes alone passes merged with others."""
    try:
        Policy(**options)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f'[tools."{pattern}"]: {exc}') from exc


def load_policy(path: str | Path) -> ProxyPolicy:
    """The policy file at `path`; `PolicyError` when it cannot be read or applied."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise PolicyError(f"cannot read the policy file {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"the policy file {path} is not valid TOML: {exc}") from exc
    return parse_policy(data)
