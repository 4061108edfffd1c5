"""`mcp-once`: the command line. One module per command; this file only dispatches.

Exit codes: 0 success, 1 the command ran and found a problem (a duplicate effect in the demo, a
record not settled), 2 bad usage or a bad store URL, 3 the store could not be reached.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import _bench, _demo, _keys, _runs, _serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcp-once",
        description="Safe retries for MCP tool calls: demo, operator commands and benchmarks.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (_demo, _keys, _runs, _serve, _bench):
        module.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # `bench` forwards its own options to benchmarks/run.py, which owns them.
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "bench":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    status: int = args.run(args)
    return status


def entry() -> None:
    sys.exit(main())
