"""`python -m benchmarks.<name>`: one benchmark on its own, with `--help` that runs nothing.

Each benchmark module ends with `standalone(__doc__, measure)`: a real argument parser (so
`--help` prints the module's purpose and exits, and an unknown option is refused) and the
figures printed as JSON. `benchmarks.run` runs them all, against their targets.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from ._scale import FULL, QUICK, Scale


def standalone(
    doc: str | None,
    measure: Callable[[Scale], dict[str, Any]],
    argv: Sequence[str] | None = None,
) -> None:
    """Parse `argv` (the command line by default), then print `measure`'s figures as JSON."""
    lines = (doc or "").strip().splitlines()
    parser = argparse.ArgumentParser(
        description=lines[0] if lines else None,
        epilog="All the benchmarks, against their targets: mcp-once bench (--help).",
    )
    parser.add_argument(
        "--quick", action="store_true", help="short rounds (seconds), instead of the full run"
    )
    args = parser.parse_args(argv)
    print(json.dumps(measure(QUICK if args.quick else FULL), indent=2))
