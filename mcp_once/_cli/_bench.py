"""`mcp-once bench`: the front door to `benchmarks/`, which lives in the repository, not the wheel.

Benchmarks pull in baselines (AWS Powertools, matplotlib) that must never be runtime dependencies,
so they stay out of the installed packages; this command finds them next to the checkout.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from ._common import EXIT_USAGE, fail

_DESCRIPTION = (
    "Run the benchmarks of benchmarks/run.py, which own their options (`mcp-once bench --help`"
    " from a checkout lists them). They live in the mcp-once repository, not in the installed"
    " package: clone it and run `uv run --group bench mcp-once bench` there."
)


def add_parser(commands: Any) -> None:
    bench = commands.add_parser(
        "bench",
        help="run the benchmarks (from a checkout; extra: uv run --group bench)",
        description=_DESCRIPTION,
        add_help=False,
    )
    bench.set_defaults(run=_run, parser=bench)


def _checkout_root() -> Path | None:
    for candidate in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (candidate / "benchmarks" / "run.py").is_file():
            return candidate
    return None


def _run(args: argparse.Namespace) -> int:
    root = _checkout_root()
    if root is None and {"-h", "--help"} & set(args.extra):
        # Help is an answer, not a usage error, even where the benchmarks are not at hand.
        args.parser.print_help()
        return 0
    if root is None:
        fail(
            "the benchmarks live in the mcp-once repository (benchmarks/run.py);"
            " run this command from a checkout",
            EXIT_USAGE,
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    runner = importlib.import_module("benchmarks.run")
    status: int = runner.main(list(args.extra))
    return status
