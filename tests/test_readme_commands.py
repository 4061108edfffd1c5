"""The documented commands that no other test runs: the soak script and the bench front door.

Each runs as a newcomer would type it (a real subprocess), at the smallest size that still
exercises the whole path, and is judged by what it reports, not by timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The README and the docs site it links to (docs/chaos.md, docs/benchmarks.md hold these commands).
README = "\n".join(
    page.read_text() for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
)


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_soak_command_reports_no_duplicates_and_a_baseline_that_has_them() -> None:
    assert "python -m mcp_once.scenarios.soak --seeds 50 --calls 300" in README
    done = run(
        "-m", "mcp_once.scenarios.soak",
        "--seeds", "1", "--first-seed", "1", "--calls", "60",
        "--transports", "memory", "--eras", "modern", "--baseline", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    totals = json.loads(done.stdout[done.stdout.index("{") :])
    ours, naive = totals["mcp-once"], totals["naive"]
    assert ours["calls"] == naive["calls"] == 60
    assert naive["duplicates"] > 0  # the same plan without mcp-once: the soak can see duplicates
    assert ours["duplicates"] == 0
    assert ours["lost_results"] == 0
    assert ours["gate_violations"] == 0


def test_bench_front_door_forwards_to_the_benchmarks() -> None:
    assert "mcp-once bench --quick --json" in README
    done = run("-m", "mcp_once", "bench", "--help", timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--quick" in done.stdout and "--json" in done.stdout
