"""`mcp-once`: the command line. One module per command; this file only dispatches.

Exit codes: 0 success, 1 the command ran and found a problem (a duplicate effect in the demo, a
record not settled), 2 bad usage or a bad store URL, 3 the store could not be reached (or, for a
command that only reads, holds nothing of mcp-once's: `_common.reading`), 141 the
reader of its output went away (`mcp-once keys list --json | head`), quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from . import _proxy, _stopping


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, wrapping only at spaces: its default breaks a long word (a URL, an
    option's example) across lines at a hyphen or anywhere, and a URL cut in two cannot be
    copied from the terminal."""

    def _wrap(self, text: str, width: int) -> list[str]:
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)

    def _split_lines(self, text: str, width: int) -> list[str]:
        return self._wrap(text, width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(indent + line for line in self._wrap(text, width - len(indent)))


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` with `_Formatter`; its subcommands' parsers are made of this class
    too (argparse makes them of the parent's class), so every help page wraps the same way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    from . import _audit, _bench, _demo, _gateway, _keys, _runs, _serve, _wrap
    from ._common import DEFAULT_STORE_URL
    from ._runs import DEFAULT_JOURNAL_URL

    parser = _Parser(
        prog="mcp-once",
        description="Safe retries for MCP tool calls: demo, proxy, operator commands, benchmarks.",
        epilog=f"Files: the key store defaults to {DEFAULT_STORE_URL} (or $MCP_ONCE_STORE),"
        " a SQLite file with its -wal and -shm side files in ./.mcp-once/, which"
        f" serve-example creates; the Run journal to {DEFAULT_JOURNAL_URL} (or $MCP_ONCE_JOURNAL)."
        " demo writes to a"
        " temporary directory it removes, or under a prefix of its own in a Redis given with"
        " --store, deleted when it ends. Histories are checked with the audit key of"
        " $MCP_ONCE_AUDIT_KEY (or the file $MCP_ONCE_AUDIT_KEY_FILE names) when set.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (_demo, _keys, _runs, _serve, _gateway, _wrap, _bench):
        module.add_parser(commands)
    _audit.add_parser(commands, _keys.run_on_store)
    return parser


def _proxy_parser() -> argparse.ArgumentParser:
    """The parser of `proxy` and `tools` alone (their help and errors are the same as in the
    whole one): `mcp-once proxy` starts a stdio upstream's child as soon as it has read its
    command line, and the other commands' modules are not imported before that (issue 46)."""
    from . import _gateway

    parser = _Parser(prog="mcp-once")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _gateway.add_parser(commands)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line as `main` reads it, without running it: what a test checks a command
    written elsewhere against (docker-compose.yml's, a desktop config's)."""
    words = list(sys.argv[1:] if argv is None else argv)
    # `proxy` and `tools` take the upstream's command line after their options (with or without
    # `--`), untouched by argparse.
    if words and words[0] in _proxy.TAKES_COMMAND:
        args = _proxy.parse_command(_proxy_parser(), words)
        args.extra = []
        return args
    parser = build_parser()
    # `bench` forwards its own options to benchmarks/run.py, which owns them.
    args, extra = parser.parse_known_args(words)
    if extra and args.command != "bench":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    args.command_line = []
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    status: int = args.run(args)
    return status


#: What a shell shows for a command killed by SIGPIPE (128 + 13): the reader of our output left
#: before it was all written. Not 0 (the output was cut short) and not 1 (that says "problem").
EXIT_BROKEN_PIPE = 141


def entry() -> None:
    """The console script: `main`, then stdout flushed while we can still say what happened.

    A reader that stops early (`| head`) is normal use, not an error: as the Python docs advise
    (signal module, "Note on SIGPIPE"), the rest of the output goes to /dev/null, so that the
    interpreter's own flush at exit cannot fail again, and the exit is quiet. After a proxy's
    stdio run, the exit skips the interpreter's teardown (`_stopping.exit_now`)."""
    try:
        try:
            status = main()
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_BROKEN_PIPE)
    if _stopping.served:  # a proxy's stdio run ended, all closed: skip the teardown
        _stopping.exit_now(status)
    sys.exit(status)
