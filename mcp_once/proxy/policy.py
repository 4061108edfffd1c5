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

[servers."payments".tools."refund"]
keys = "required"            # only the upstream named "payments" (its tool `refund`)
```

Every table applies to the tools its name matches (`fnmatch` globs); where several match, an exact
name wins over globs, and among globs the later table wins key by key. A `[servers."<name>"]`
section applies only to the upstream of that name (a proxy in front of several, or one named so),
matched against the upstream's own tool names (`refund`, not the front's `payments_refund`), and
has the last word over the plain `[tools…]` tables, which apply to every upstream. A key this
module does not know, or a value the guard would refuse (`keys = "mandatory"`, `retention =
"1d"`), is an error that names its table, raised as the file is read: a typo must not silently
leave a tool unguarded, and `mcp-once proxy` and `mcp-once tools` both read it with
`load_policy`, so a policy `tools` accepts is one the proxy starts with. A table that matches no
tool of its upstream is reported with the nearest tool name (`said_unmatched`).
"""

from __future__ import annotations

import fnmatch
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
    #: The upstream whose `[servers."<name>"]` section holds the table (None: a plain table).
    server: str | None = None

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.pattern)

    @property
    def exact(self) -> bool:
        return not any(c in self.pattern for c in "*?[")

    @property
    def label(self) -> str:
        """How reports name the table: its pattern, with its section for a server's own."""
        if self.server is None:
            return self.pattern
        return f'servers."{self.server}".tools."{self.pattern}"'


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
    """The whole policy file: its rules in file order (the plain tables, then each
    `[servers."<name>"]` section's)."""

    rules: tuple[ToolRule, ...] = ()

    @property
    def servers(self) -> list[str]:
        """The upstreams the file has a `[servers."<name>"]` section for, in file order."""
        return list(dict.fromkeys(r.server for r in self.rules if r.server is not None))

    def for_server(self, name: str) -> ProxyPolicy:
        """The policy of the upstream `name`: the plain tables and its own section (the other
        upstreams' sections dropped)."""
        return ProxyPolicy(tuple(r for r in self.rules if r.server in (None, name)))

    def for_tool(self, name: str) -> ToolPolicy:
        matching = [r for r in self.rules if r.matches(name)]
        # Plain tables before a server's own section; in each, globs before exact names: the
        # most specific table has the last word.
        ordered = sorted(matching, key=lambda r: (r.server is not None, r.exact))
        guard: bool | None = None
        idempotent = False
        options: dict[str, Any] = {}
        for rule in ordered:
            if rule.guard is not None:
                guard = rule.guard
            if rule.upstream_idempotent is not None:
                idempotent = rule.upstream_idempotent
            options.update(rule.options)
        return ToolPolicy(guard, idempotent, options, tuple(r.label for r in ordered))

    def unmatched(self, names: Iterable[str]) -> list[str]:
        """The tables (`ToolRule.label`) that match none of `names` (a typo shows)."""
        listed = list(names)
        return [r.label for r in self.rules if not any(r.matches(n) for n in listed)]

    def said_unmatched(self, label: str, names: Iterable[str], of: str = "the upstream") -> str:
        """The report of the table `label` (as `unmatched` names it) matching none of `names`,
        the tools of `of`: with the name nearest its pattern where one is close (`difflib`)."""
        import difflib  # here, not at start-up: only a policy that matches nothing needs it

        patterns = [r.pattern for r in self.rules if r.label == label]
        close = difflib.get_close_matches(patterns[0], list(names), n=1) if patterns else []
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"policy pattern {label!r} matches no tool of {of}{hint}"

    def unmatched_said(self, names: Iterable[str]) -> list[str]:
        """A sentence per table that matches none of `names` (`said_unmatched`): what
        `mcp-once tools` prints and the proxy logs."""
        listed = list(names)
        return [self.said_unmatched(label, listed) for label in self.unmatched(listed)]


def _flag(where: str, key: str, value: object) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise PolicyError(f"[{where}] {key} must be true or false, not {value!r}")
    return value


def _tool_rules(tools: object, section: str, server: str | None) -> list[ToolRule]:
    """The `[<section>."<pattern>"]` tables of one `tools` table."""
    if not isinstance(tools, Mapping):
        raise PolicyError(f'"{section}" must be a table of [{section}."<name or glob>"] tables')
    rules: list[ToolRule] = []
    for pattern, table in tools.items():
        where = f'{section}."{pattern}"'
        if not isinstance(table, Mapping):
            raise PolicyError(f"[{where}] must be a table")
        bad = set(table) - TOOL_KEYS
        if bad:
            raise PolicyError(
                f"unknown policy key(s) in [{where}]: {', '.join(sorted(bad))}"
                f" (known: {', '.join(sorted(TOOL_KEYS))})"
            )
        options = {k: v for k, v in table.items() if k in GUARD_KEYS}
        _check_options(where, options)
        guard = _flag(where, "guard", table.get("guard"))
        idempotent = _flag(where, "upstream_idempotent", table.get("upstream_idempotent"))
        rules.append(ToolRule(pattern, guard, idempotent, options, server))
    return rules


def parse_policy(data: Mapping[str, Any]) -> ProxyPolicy:
    """A `ProxyPolicy` from the parsed TOML; `PolicyError` naming the first thing wrong."""
    unknown = set(data) - {"tools", "servers"}
    if unknown:
        raise PolicyError(
            f"unknown policy key(s): {', '.join(sorted(unknown))} (only [tools.*] and"
            " [servers.*.tools.*])"
        )
    rules = _tool_rules(data.get("tools", {}), "tools", None)
    servers = data.get("servers", {})
    if not isinstance(servers, Mapping):
        raise PolicyError('"servers" must be a table of [servers."<upstream name>"] sections')
    for server, section in servers.items():
        where = f'servers."{server}"'
        extra = sorted(set(section) - {"tools"}) if isinstance(section, Mapping) else []
        if not isinstance(section, Mapping) or extra:
            found = f", not {', '.join(extra)}" if extra else ""
            raise PolicyError(
                f'[{where}] holds only [{where}.tools."<name or glob>"] tables{found}'
            )
        rules += _tool_rules(section.get("tools", {}), f"{where}.tools", str(server))
    return ProxyPolicy(tuple(rules))


def _check_options(where: str, options: Mapping[str, Any]) -> None:
    """The table `where`'s guard options as the guard checks them (`Policy`): each option is
    checked on its own there, so a table that passes alone passes merged with others."""
    try:
        Policy(**options)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"[{where}]: {exc}") from exc


def load_policy(path: str | Path) -> ProxyPolicy:
    """The policy file at `path`; `PolicyError` when it cannot be read or applied."""
    import tomllib  # here, not at start-up: a proxy without --policy never reads TOML

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise PolicyError(f"cannot read the policy file {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"the policy file {path} is not valid TOML: {exc}") from exc
    return parse_policy(data)
