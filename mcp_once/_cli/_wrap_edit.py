"""What `mcp-once wrap` changes in a client's config file, as text edits of single entries.

Pure: text in, edits out, no files and no processes (`_wrap.py` reads, writes and reports).

A config is the user's file: other settings, key order, indentation, comments (JSONC) and line
endings are theirs. So an entry is never re-serialised; its text is edited where it must change
(`_jsonc.py` gives every value's span), and `check` re-reads the result to prove that the entries
meant to change are what they should be and nothing else differs.

Wrapping an entry (`plan_wrap`) makes it run `mcp-once proxy --name NAME -- COMMAND ARGS...`:
- `command` becomes the launcher (`_launcher.py`); the original command's token (its bytes) and
  the launcher's arguments, `proxy`, `--name NAME`, `--` go at the front of `args`, in the array's
  own layout (one per line in a multi-line array); an entry without `args` gets one after
  `command`;
- a URL entry (`url`, Windsurf's `serverUrl`; `type` `http`/`streamable-http`) becomes a stdio
  entry: its URL member becomes `command` and `args` (`... --upstream URL`, the URL's token kept),
  its `type` `stdio`. One with `headers` is refused (the proxy takes headers only from a config
  file, never on its command line, which every process on the machine can read), as is one whose
  URL holds credentials or a query, and an SSE server (the proxy speaks streamable HTTP only).
- every other member (`env`, `cwd`, `type` of a stdio entry, a client's own keys) is untouched.

Undoing (`plan_undo`) restores an entry that `wrap` wrote (its proxy options are `--name` and
`--upstream` only; an entry wrapped by hand with more options is left as it is):
- from the backup, byte for byte, when the backup holds an entry of that name that wraps to the
  entry as it is now (edits elsewhere in the file do not matter, an edit of that entry does);
- else from its own command line, which holds the original command and arguments (their tokens):
  the exact original text where the entry had `args`, an equal value otherwise (`"args": []`, the
  client's URL key and `"type": "http"`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mcp_once._upstream import Upstream, UpstreamConfigError
from mcp_once._upstream.identity import check_name

from ._jsonc import Document, Member, Node, parse
from ._proxy import Wrapped, parse_proxy_arguments, proxied_arguments, seen_through

#: Where the servers of each client's config are: Claude Desktop, Cursor, Windsurf, Claude
#: Code's `.mcp.json` (`mcpServers`); VS Code's `mcp.json` (`servers`) and settings (`mcp.servers`);
#: Claude Code's `~/.claude.json` per project (`projects.<folder>.mcpServers`, found below).
SERVER_PATHS: tuple[tuple[str, ...], ...] = (("mcpServers",), ("servers",), ("mcp", "servers"))
#: The `type` values of a streamable HTTP entry across clients.
HTTP_TYPES = frozenset({"http", "streamable-http", "streamableHttp", "streamable_http"})
#: The proxy options `wrap` writes (an entry with others was wrapped by hand: undo leaves it).
OWN_OPTIONS = frozenset({"--name", "--upstream"})


@dataclass(frozen=True, slots=True)
class Edit:
    """Replace `text[start:end]` with `new` (an insertion where start == end)."""

    start: int
    end: int
    new: str


def apply(text: str, edits: Iterable[Edit]) -> str:
    parts: list[str] = []
    at = 0
    for edit in sorted(edits, key=lambda e: (e.start, e.end)):
        if edit.start < at:
            raise ValueError(f"overlapping edits at {edit.start}")
        parts += [text[at : edit.start], edit.new]
        at = edit.end
    return "".join([*parts, text[at:]])


@dataclass(frozen=True, slots=True)
class Servers:
    """One object of server entries in the file, and the keys that lead to it."""

    path: tuple[str, ...]
    node: Node

    @property
    def where(self) -> str:
        """The path for a person: `mcpServers`, `projects["/home/me/app"].mcpServers`."""
        if self.path[0] == "projects":
            return f"projects[{json.dumps(self.path[1])}].{self.path[2]}"
        return ".".join(self.path)


def servers_in(document: Document) -> list[Servers]:
    root = document.root
    if root.kind != "object":
        return []
    found = []
    for path in SERVER_PATHS:
        node: Node | None = root
        for key in path:
            node = node.get(key) if node is not None and node.kind == "object" else None
        if node is not None and node.kind == "object":
            found.append(Servers(path, node))
    projects = root.get("projects")
    for project in projects.members if projects is not None and projects.kind == "object" else []:
        node = project.value.get("mcpServers") if project.value.kind == "object" else None
        if node is not None and node.kind == "object":
            found.append(Servers(("projects", project.key, "mcpServers"), node))
    return found


@dataclass(frozen=True, slots=True)
class Entry:
    servers: Servers
    member: Member

    @property
    def name(self) -> str:
        return self.member.key

    @property
    def node(self) -> Node:
        return self.member.value

    @property
    def where(self) -> str:
        return f"{self.servers.where}.{self.name}"


def entries_in(servers: Sequence[Servers]) -> list[Entry]:
    return [Entry(s, m) for s in servers for m in s.node.members]


@dataclass(frozen=True, slots=True)
class Client:
    """What the file's client allows and expects: comments (JSONC), and the key of a URL entry
    (used where an entry's original is restored from its command line)."""

    name: str
    comments: bool
    url_key: str


def client_of(path: Path, servers: Sequence[Servers]) -> Client:
    if any(s.path in (("servers",), ("mcp", "servers")) for s in servers):
        return Client("VS Code", comments=True, url_key="url")
    comments = path.suffix == ".jsonc"
    if path.name == "mcp_config.json":
        return Client("Windsurf", comments, url_key="serverUrl")
    return Client("mcpServers", comments, url_key="url")


@dataclass
class Plan:
    """What `wrap` or `wrap --undo` does with one entry, and what the report shows."""

    entry: Entry
    #: "wrapped", "already wrapped", "refused", "restored", "not wrapped", "left as it is".
    change: str
    edits: list[Edit] = field(default_factory=list)
    #: The entry's value once edited (what `check` compares the re-read file with).
    expected: Any = None
    #: Why an entry is refused or left as it is, or how it was restored.
    note: str = ""
    #: The upstream the proxy serves (for the tools listing), and that proxy's policy file.
    upstream: Upstream | None = None
    policy: str | None = None

    @property
    def refused(self) -> bool:
        return self.change in ("refused", "left as it is")


def _dump(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _separator(text: str, opened: int, spans: Sequence[tuple[int, int]]) -> str:
    """`,` and the blank a container puts before each of its members or items (their spans,
    after the opening bracket at `opened`): its layout, for a new one."""
    if len(spans) >= 2:
        gap = text[spans[0][1] : spans[1][0]]
    elif spans:
        gap = text[opened + 1 : spans[0][0]]
    else:
        gap = ""
    return "," + (gap[len(gap.rstrip(" \t\r\n")) :] or " ")


def _member_separator(text: str, node: Node) -> str:
    return _separator(text, node.start, [(m.key_start, m.value.end) for m in node.members])


def _item_separator(text: str, node: Node) -> str:
    return _separator(text, node.start, [(item.start, item.end) for item in node.items])


def _colon(text: str, member: Member) -> str:
    gap = text[member.key_end : member.value.start]
    return gap if gap.strip() == ":" else ": "


def _remove_member(node: Node, member: Member) -> Edit:
    """Remove `member` and one comma next to it from the object `node`."""
    members = node.members
    index = next(i for i, m in enumerate(members) if m is member)
    if index > 0:
        return Edit(members[index - 1].value.end, member.value.end, "")
    if index + 1 < len(members):
        return Edit(member.key_start, members[index + 1].key_start, "")
    return Edit(member.key_start, member.value.end, "")


def _url_key(value: dict[str, Any]) -> str | None:
    for key in ("url", "serverUrl"):
        if isinstance(value.get(key), str):
            return key
    return None


def _kind(value: dict[str, Any]) -> str:
    """`stdio`, `url`, or why the entry is neither (a sentence)."""
    kind = value.get("type")
    command = isinstance(value.get("command"), str)
    url = _url_key(value) is not None
    if kind == "sse":
        return "an SSE server: mcp-once proxy reaches an HTTP upstream by streamable HTTP only"
    if kind in HTTP_TYPES or (kind is None and url and not command):
        return "url" if url else f"type {kind!r} without a url"
    if kind in (None, "stdio"):
        return "stdio" if command else "neither a command nor a url"
    return f"type {kind!r} is not one mcp-once proxy can front (stdio, http)"


def wrapped_value(value: dict[str, Any], name: str, launcher: Sequence[str]) -> dict[str, Any]:
    """`value` (an entry, as `json.loads` reads it) wrapped: what `plan_wrap`'s edits give."""
    proxy = [*launcher[1:], "proxy", "--name", name]
    wrapped = dict(value)
    url_key = _url_key(value)
    if _kind(value) == "url" and url_key is not None:
        url = wrapped.pop(url_key)
        wrapped.update(command=launcher[0], args=[*proxy, "--upstream", url])
        if "type" in wrapped:
            wrapped["type"] = "stdio"
    else:
        original = [value["command"], *value.get("args", [])]
        wrapped.update(command=launcher[0], args=[*proxy, "--", *original])
    return wrapped


@dataclass(frozen=True, slots=True)
class ProxyCommand:
    """An entry whose command runs `mcp-once proxy`: the launcher words before `proxy`, the
    proxy's options, the upstream's command line after them, and the options as parsed (None
    when they do not parse)."""

    launcher: list[str]
    options: list[str]
    inner: list[str]
    parsed: argparse.Namespace | None


def proxy_command(words: Sequence[str]) -> ProxyCommand | None:
    rest = proxied_arguments(words)
    if rest is None:
        return None
    launcher = list(words[: len(words) - len(rest) - 1])
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parsed = parse_proxy_arguments(rest)
    except SystemExit:
        return ProxyCommand(launcher, rest, [], None)
    inner = list(parsed.command_line)
    return ProxyCommand(launcher, rest[: len(rest) - len(inner)], inner, parsed)


def _foreign_option(options: Sequence[str]) -> str | None:
    """The first proxy option `wrap` does not write, or None."""
    words = list(options[:-1] if options and options[-1] == "--" else options)
    index = 0
    while index < len(words):
        flag, equals, _ = words[index].partition("=")
        if flag not in OWN_OPTIONS:
            return flag
        index += 1 if equals else 2
    return None


def _command_words(value: dict[str, Any]) -> list[str] | None:
    command, args = value.get("command"), value.get("args", [])
    if not isinstance(command, str) or not isinstance(args, list):
        return None
    if not all(isinstance(a, str) for a in args):
        return None
    return [command, *args]


def _refused(entry: Entry, why: str, change: str = "refused") -> Plan:
    return Plan(entry, change, note=why)


def _upstream(entry: Entry, value: dict[str, Any]) -> Upstream | str:
    try:
        return Upstream.from_entry(value, entry.name, entry.where)
    except UpstreamConfigError as exc:
        return str(exc)


def plan_wrap(text: str, entry: Entry, launcher: Sequence[str]) -> Plan:
    """What wrapping `entry` takes (see the module doc)."""
    node = entry.node
    if node.kind != "object":
        return _refused(entry, "not an object")
    value = node.value()
    try:
        check_name(entry.name)
    except ValueError as exc:
        return _refused(entry, f"its name cannot name a proxy: {exc}")
    kind = _kind(value)
    if kind not in ("stdio", "url"):
        return _refused(entry, kind)
    upstream = _upstream(entry, value)
    if isinstance(upstream, str):
        return _refused(entry, upstream)
    if kind == "url":
        return _plan_url(text, entry, value, upstream, launcher)
    words = _command_words(value)
    if words is None:
        return _refused(entry, "its args are not a list of strings")
    if proxy_command(words) is not None:
        return _already(entry, upstream)
    cmd = node.member("command")
    assert cmd is not None
    new = [_dump(w) for w in (*launcher[1:], "proxy", "--name", entry.name, "--")]
    new.append(text[cmd.value.start : cmd.value.end])
    edits = [Edit(cmd.value.start, cmd.value.end, _dump(launcher[0]))]
    args = node.member("args")
    if args is None:
        added = f"{_member_separator(text, node)}{_dump('args')}{_colon(text, cmd)}"
        edits.append(Edit(cmd.value.end, cmd.value.end, f"{added}[{', '.join(new)}]"))
    elif args.value.items:
        separator = _item_separator(text, args.value)
        at = args.value.items[0].start
        edits.append(Edit(at, at, separator.join(new) + separator))
    else:
        edits.append(Edit(args.value.start + 1, args.value.start + 1, ", ".join(new)))
    expected = wrapped_value(value, entry.name, launcher)
    return Plan(entry, "wrapped", edits, expected, upstream=upstream)


def _already(entry: Entry, upstream: Upstream) -> Plan:
    """An entry that runs the proxy already: left as it is; its real upstream is what the proxy
    serves (seen through as `mcp-once tools` sees through it)."""
    wrapped, loop = seen_through(upstream)
    if loop or not wrapped:
        why = "a proxy loop" if loop else "its mcp-once proxy command names no upstream"
        return Plan(entry, "already wrapped", note=why)
    real: Wrapped = wrapped[-1]
    return Plan(entry, "already wrapped", upstream=real.upstream, policy=real.policy)


def _plan_url(
    text: str, entry: Entry, value: dict[str, Any], upstream: Upstream, launcher: Sequence[str]
) -> Plan:
    if value.get("headers"):
        return _refused(
            entry,
            "it has headers, which mcp-once proxy takes only from a config file, never on its"
            " command line (every process on this machine can read a command line): keep the"
            " entry in a file of its own and point an entry here at it by hand (`mcp-once proxy"
            " --config THAT_FILE --server NAME`)",
        )
    url = upstream.url or ""
    parts = urlsplit(url)
    if parts.username or parts.password or parts.query:
        return _refused(
            entry,
            "its URL holds credentials or a query, which may be a secret, and the proxy would"
            " have it on its command line (every process on this machine can read it): wrap it"
            " by hand if it is not one",
        )
    node = entry.node
    key = _url_key(value)
    assert key is not None
    member = node.member(key)
    assert member is not None
    colon = _colon(text, member)
    new = [_dump(w) for w in (*launcher[1:], "proxy", "--name", entry.name, "--upstream")]
    new.append(text[member.value.start : member.value.end])
    command = f"{_dump('command')}{colon}{_dump(launcher[0])}"
    args = f"{_dump('args')}{colon}[{', '.join(new)}]"
    replaced = command + _member_separator(text, node) + args
    edits = [Edit(member.key_start, member.value.end, replaced)]
    kind = node.member("type")
    if kind is not None:
        edits.append(Edit(kind.value.start, kind.value.end, _dump("stdio")))
    expected = wrapped_value(value, entry.name, launcher)
    return Plan(entry, "wrapped", edits, expected, upstream=upstream)


def _backup_entry(backup: Document | None, entry: Entry) -> Node | None:
    """The backup's entry of the same name in the same place, if any."""
    if backup is None:
        return None
    for servers in servers_in(backup):
        if servers.path == entry.servers.path:
            return servers.node.get(entry.name)
    return None


def plan_undo(text: str, entry: Entry, backup: Document | None, client: Client) -> Plan:
    """What restoring `entry` takes (see the module doc)."""
    node = entry.node
    value = node.value() if node.kind == "object" else None
    words = _command_words(value) if isinstance(value, dict) else None
    found = None if words is None else proxy_command(words)
    if value is None or words is None or found is None:
        return Plan(entry, "not wrapped")
    assert isinstance(value, dict)
    left = "left as it is"
    if found.parsed is None:
        return _refused(entry, "its mcp-once proxy command does not parse", left)
    foreign = _foreign_option(found.options)
    if foreign is not None:
        return _refused(
            entry,
            f"wrapped with {foreign}, which wrap does not write: restore it by hand",
            left,
        )
    name = found.parsed.name
    original = _backup_entry(backup, entry)
    if backup is not None and original is not None and original.kind == "object" and name:
        before = original.value()
        if _kind(before) in ("stdio", "url") and (
            wrapped_value(before, name, found.launcher) == value
        ):
            restored = backup.text[original.start : original.end]
            return Plan(entry, "restored", [Edit(node.start, node.end, restored)], before)
    if found.inner:
        return _undo_stdio(text, entry, value, found)
    return _undo_url(text, entry, value, found, client)


def _undo_stdio(text: str, entry: Entry, value: dict[str, Any], found: ProxyCommand) -> Plan:
    node = entry.node
    cmd, args = node.member("command"), node.member("args")
    assert cmd is not None and args is not None
    items = args.value.items
    first = len(found.launcher) + len(found.options)  # the original command, in `args`
    edits = [Edit(cmd.value.start, cmd.value.end, text[items[first].start : items[first].end])]
    if first + 1 < len(items):
        edits.append(Edit(items[0].start, items[first + 1].start, ""))
    else:
        end = items[first].end
        rest = text[end:].lstrip(" \t\r\n")
        if rest.startswith(","):  # a trailing comma (JSONC) would be left alone in `[,]`
            end = len(text) - len(rest) + 1
        edits.append(Edit(items[0].start, end, ""))
    expected = {**value, "command": found.inner[0], "args": found.inner[1:]}
    note = "from its command line (the backup does not hold it as it was wrapped)"
    return Plan(entry, "restored", edits, expected, note=note)


def _undo_url(
    text: str, entry: Entry, value: dict[str, Any], found: ProxyCommand, client: Client
) -> Plan:
    assert found.parsed is not None
    url = found.parsed.upstream
    if not isinstance(url, str):
        return _refused(entry, "its proxy command names no upstream", "left as it is")
    node = entry.node
    cmd, args = node.member("command"), node.member("args")
    assert cmd is not None and args is not None
    token = _dump(url)
    for before, item in zip(args.value.items, args.value.items[1:], strict=False):
        if before.scalar == "--upstream" and item.scalar == url:
            token = text[item.start : item.end]
    restored = f"{_dump(client.url_key)}{_colon(text, cmd)}{token}"
    edits = [Edit(cmd.key_start, cmd.value.end, restored), _remove_member(node, args)]
    expected = {k: v for k, v in value.items() if k not in ("command", "args")}
    expected[client.url_key] = url
    kind = node.member("type")
    if kind is not None and kind.value.scalar == "stdio":
        edits.append(Edit(kind.value.start, kind.value.end, _dump("http")))
        expected["type"] = "http"
    note = "from its command line (the backup does not hold it as it was wrapped)"
    return Plan(entry, "restored", edits, expected, note=note)


class EditFailed(RuntimeError):
    """The edited text is not what the plans say it must be (a bug: nothing is written)."""


def check(before: Document, after_text: str, plans: Sequence[Plan]) -> None:
    """Re-read `after_text` and compare it with `before` where only the planned entries
    changed, to the planned values; plain JSON stays plain JSON."""
    expected = before.root.value()
    for plan in plans:
        if plan.edits:
            place = expected
            for key in plan.entry.servers.path:
                place = place[key]
            place[plan.entry.name] = plan.expected
    try:
        after = parse(after_text)
    except ValueError as exc:
        raise EditFailed(f"the edited file does not parse: {exc}") from exc
    if after.root.value() != expected:
        raise EditFailed("the edited file differs from the planned one")
    if before.jsonc is None and after.jsonc is not None:
        raise EditFailed("the edited file is no longer plain JSON")
