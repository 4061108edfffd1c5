"""`mcp-once wrap CONFIG`: put `mcp-once proxy` in front of a client config's servers, in place.

Claude Desktop, Claude Code (`.mcp.json`, `~/.claude.json` per project), Cursor, Windsurf, VS
Code (`servers`, JSONC) and any `mcpServers` file. The edits are `_wrap_edit.py`'s: only the
entries' command lines change, every other byte of the file stays, and the result is re-read and
compared before anything is written. A file that is not JSON (JSONC where the client allows it),
has no servers, or cannot be written is refused in one line, exit 2, untouched.

Writing: the new text goes to a temporary file in the config's own folder (the same file system),
is flushed to disk, given the config's mode, and renamed over the config (`os.replace`, atomic):
a crash leaves the old file or the new one, never half of one. A symlinked config is replaced at
its target, so the link stays. Before that, the backup `CONFIG.mcp-once.bak` (same mode: a config
holds secrets in `env`) is written the same way: the config with nothing wrapped (a copy of it
when nothing was; entries wrapped by an earlier run as they were before). `--undo` restores from
it byte for byte, or from an entry's own command line where the backup does not hold it.

Then the report: a table of what changed, and each wrapped entry's tools as `mcp-once tools`
judges them, listed from the real upstream (each started at most `--timeout` seconds, several at
once; one that cannot start is reported, never fatal; `--no-tools` lists none).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from ._common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, fail, print_table
from ._durations import duration
from ._jsonc import Document, JsoncError, parse
from ._launcher import Launcher, find_launcher
from ._wrap_edit import (
    Client,
    EditFailed,
    Entry,
    Plan,
    apply,
    check,
    client_of,
    entries_in,
    plan_undo,
    plan_wrap,
    servers_in,
)

#: The backup's name: the config's, with this after it.
BACKUP_SUFFIX = ".mcp-once.bak"
#: How long one server may take to start and list its tools, by default (npx may download).
TOOLS_TIMEOUT = 30.0
#: Servers started at once for their tools.
TOOLS_AT_ONCE = 4


def add_parser(commands: Any) -> None:
    wrap = commands.add_parser(
        "wrap",
        help="put mcp-once proxy in front of a client config's servers, in place (--undo)",
        description="Rewrite the servers of a client's config (Claude Desktop, Claude Code,"
        " Cursor, Windsurf, VS Code's mcp.json, any mcpServers JSON) so that each runs through"
        " mcp-once proxy --name ENTRY, by the absolute path of this mcp-once; every other byte"
        " of the file stays. Writes CONFIG.mcp-once.bak first and replaces the file atomically;"
        " prints what changed and each server's tools as mcp-once tools judges them.",
    )
    wrap.add_argument("config", metavar="CONFIG", help="the client's JSON (or JSONC) config file")
    wrap.add_argument(
        "--server",
        metavar="NAME",
        action="append",
        help="only this server entry (repeatable; default: every entry)",
    )
    wrap.add_argument(
        "--dry-run", action="store_true", help="show the change as a unified diff; write nothing"
    )
    wrap.add_argument(
        "--undo",
        action="store_true",
        help="restore the wrapped entries as they were (from the backup, else their command line)",
    )
    wrap.add_argument(
        "--no-tools", action="store_true", help="do not start the servers to list their tools"
    )
    wrap.add_argument(
        "--timeout",
        type=duration,
        default=TOOLS_TIMEOUT,
        metavar="DURATION",
        help="how long each server may take to list its tools (seconds, or 1m;"
        f" default {TOOLS_TIMEOUT:g})",
    )
    wrap.set_defaults(run=run_wrap)


def backup_path(config: Path) -> Path:
    return config.with_name(config.name + BACKUP_SUFFIX)


def _read(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}", EXIT_USAGE)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"{path} is not JSON: it is not UTF-8 text", EXIT_USAGE)


def _backup(config: Path) -> Document | None:
    """The backup's text as a tree, or None where there is none (or it is no longer JSON)."""
    try:
        return parse(backup_path(config).read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return None


def _selected(path: Path, every: list[Entry], wanted: Sequence[str] | None) -> list[Entry]:
    seen: set[tuple[tuple[str, ...], str]] = set()
    for entry in every:
        if (entry.servers.path, entry.name) in seen:
            fail(
                f"{path}: {entry.where} is there twice (a client reads the last): remove one",
                EXIT_USAGE,
            )
        seen.add((entry.servers.path, entry.name))
    names = [e.name for e in every]
    if not wanted:
        return every
    missing = [w for w in wanted if w not in names]
    if missing:
        fail(
            f"{path} has no server {', '.join(map(repr, missing))} (its servers:"
            f" {', '.join(sorted(set(names)))})",
            EXIT_USAGE,
        )
    return [e for e in every if e.name in wanted]


def _load(path: Path) -> tuple[str, Document, list[Entry], Client]:
    """The config read and checked (exit 2 in one line when it is not a client's config)."""
    text = _read(path)
    try:
        document = parse(text)
    except JsoncError as exc:
        fail(f"{path} is not JSON: {exc}", EXIT_USAGE)
    servers = servers_in(document)
    every = entries_in(servers)
    if not every:
        fail(
            f"{path} has no MCP servers (no entries under mcpServers, servers, mcp.servers or"
            " projects.<folder>.mcpServers)",
            EXIT_USAGE,
        )
    client = client_of(path, servers)
    if document.jsonc is not None and not client.comments:
        line, column = document.jsonc
        fail(
            f"{path} is not JSON: a comment or a trailing comma at line {line} column {column}"
            ' (only VS Code\'s mcp.json, with its servers under "servers", allows them)',
            EXIT_USAGE,
        )
    return text, document, every, client


def _writable(path: Path) -> None:
    """Exit 2 in one line when the config or its folder cannot be written."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & 0o222 or not os.access(path, os.W_OK):
        fail(f"cannot write {path}: it is read-only (mode {mode:04o}); nothing changed", EXIT_USAGE)
    folder = path.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        fail(
            f"cannot write {path}: its folder {folder} cannot be written (the file is replaced"
            " through a new file beside it); nothing changed",
            EXIT_USAGE,
        )


def replace_atomically(path: Path, text: str, mode: int) -> None:
    """Write `text` to a new file beside `path`, flush it to disk, give it `mode`, and rename it
    over `path`; on any failure the new file is removed and `path` is as it was."""
    descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(text.encode("utf-8"))
            file.flush()
            os.fsync(file.fileno())
        os.chmod(partial, mode)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    with contextlib.suppress(OSError):  # the rename itself on disk (POSIX; not on Windows)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def _write(path: Path, text: str, backup: str | None) -> None:
    _writable(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    try:
        if backup is not None:
            replace_atomically(backup_path(path), backup, mode)
        replace_atomically(path, text, mode)
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}; the file is as it was", EXIT_USAGE)


def _unwrapped(text: str, document: Document, every: list[Entry], path: Path) -> str:
    """The config with nothing wrapped: what the backup holds (see the module doc)."""
    client = client_of(path, servers_in(document))
    backup = _backup(path)
    plans = [plan_undo(text, e, backup, client) for e in every]
    return apply(text, [edit for plan in plans for edit in plan.edits])


def run_wrap(args: argparse.Namespace) -> int:
    # The file a symlink points to is the one replaced: the link stays.
    path = Path(os.path.realpath(args.config))
    text, document, every, client = _load(path)
    chosen = _selected(path, every, args.server)
    launcher = find_launcher()
    if args.undo:
        backup = _backup(path)
        plans = [plan_undo(text, e, backup, client) for e in chosen]
    else:
        plans = [plan_wrap(text, e, launcher.words) for e in chosen]
    new = apply(text, [edit for plan in plans for edit in plan.edits])
    try:
        check(document, new, plans)
    except EditFailed as exc:
        fail(
            f"{path}: {exc} (a bug in mcp-once wrap: please report it); nothing changed",
            EXIT_PROBLEM,
        )
    if args.dry_run:
        _print_diff(args.config, text, new, "restored" if args.undo else "wrapped")
    elif new != text:
        backup_text = None if args.undo else _unwrapped(text, document, every, path)
        _write(path, new, backup_text)
    _report(args, path, plans, launcher, changed=new != text)
    return EXIT_PROBLEM if any(p.refused for p in plans) else EXIT_OK


def _print_diff(shown: str, old: str, new: str, made: str) -> None:
    if old == new:
        print("mcp-once: no change")
        return
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=shown,
        tofile=f"{shown} ({made})",
    )
    for line in lines:
        sys.stdout.write(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")


def _report(
    args: argparse.Namespace, path: Path, plans: list[Plan], launcher: Launcher, *, changed: bool
) -> None:
    listed = {} if args.undo or args.no_tools else _tools(plans, args.timeout)
    rows = [
        [
            p.entry.name,
            p.entry.servers.where,
            p.change,
            p.upstream.described() if p.upstream is not None else "-",
            listed.get(id(p), ("-", ""))[0],
        ]
        for p in plans
    ]
    print_table(("SERVER", "IN", "CHANGE", "UPSTREAM", "TOOLS"), rows)
    for plan in plans:
        if plan.note:
            print(f"  {plan.entry.where}: {plan.change}: {plan.note}")
    if args.dry_run:
        said = "dry run: nothing written"
    elif not changed:
        said = "nothing to change"
    elif args.undo:
        said = f"restored {path}"
    else:
        said = (
            f"wrapped {path}; its entries run {' '.join(launcher.words)} ({launcher.how});"
            f" the file with nothing wrapped is in {backup_path(path)}"
        )
    print(f"mcp-once: {said}")
    for plan in plans:
        found = listed.get(id(plan))
        if found and found[1]:
            print(f"\n{plan.entry.where} ({plan.upstream.described() if plan.upstream else ''}):")
            print(found[1])


def _tools(plans: list[Plan], timeout: float) -> dict[int, tuple[str, str]]:
    """For each plan with an upstream: a one-cell summary and the `tools` table (or why not)."""
    wanted = [p for p in plans if p.upstream is not None and not p.refused]
    if not wanted:
        return {}
    try:
        import mcp_once.proxy  # noqa: F401
    except ImportError as exc:
        return {id(p): (f"not listed: {exc}", "") for p in wanted}
    found: dict[int, tuple[str, str]] = {}

    async def main() -> None:
        limiter = anyio.CapacityLimiter(TOOLS_AT_ONCE)
        async with anyio.create_task_group() as group:
            for plan in wanted:
                group.start_soon(_list_one, plan, timeout, limiter, found)

    anyio.run(main)
    return found


async def _list_one(
    plan: Plan,
    timeout: float,
    limiter: anyio.CapacityLimiter,
    found: dict[int, tuple[str, str]],
) -> None:
    from mcp_once.proxy import PolicyError, ProxyPolicy, load_policy
    from mcp_once.proxy.report import rows, table

    from ._proxy import upstream_tools

    assert plan.upstream is not None
    async with limiter:
        try:
            policy = ProxyPolicy() if plan.policy is None else load_policy(plan.policy)
            with anyio.fail_after(timeout):
                tools = await upstream_tools(plan.upstream)
        except TimeoutError:
            found[id(plan)] = (f"not listed: no answer within {timeout:g} s", "")
            return
        except PolicyError as exc:
            found[id(plan)] = (f"not listed: its policy: {exc}", "")
            return
        except Exception as exc:  # a report: a server that cannot start is a row, never fatal
            cause: BaseException = exc
            while cause.__cause__ is not None:  # the first failure says it best (no such file)
                cause = cause.__cause__
            found[id(plan)] = (f"not listed: {cause}".splitlines()[0], "")
            return
    judged = rows(tools, policy)
    guarded = sum(r.action == "guarded" for r in judged)
    summary = f"{len(judged)} tools: {guarded} guarded, {len(judged) - guarded} pass-through"
    found[id(plan)] = (summary, table(judged))
