"""`mcp-once bench` and the `benchmarks/` entry points as a user meets them: dependencies
checked before anything runs (with the exact command to get them), `--check` failing on a missed
target, and `--help` on every entry point printing help without running a benchmark.

No benchmark runs here: `--help` exits in argparse, the dependency check comes first, and the
`--check` verdict is read from a fixed result."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import run as bench_run

REPO = Path(__file__).resolve().parent.parent
ENTRY_POINTS = sorted(
    path.stem
    for path in (REPO / "benchmarks").glob("*.py")
    if 'if __name__ == "__main__":' in path.read_text()
)


def python(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python *argv` from the checkout's root, as a user runs a benchmark."""
    command = [sys.executable, *argv]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_every_benchmark_module_with_a_main_is_found() -> None:
    assert {"run", "cluster_throughput", "store_throughput", "failover"} <= set(ENTRY_POINTS)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_prints_and_runs_nothing(module: str) -> None:
    started = time.monotonic()
    done = python("-m", f"benchmarks.{module}", "--help")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr[-2000:]
    assert done.stdout.startswith("usage:") and "--help" in done.stdout
    assert time.monotonic() - started < 30  # no measurement (the shortest takes longer)


def test_an_unknown_option_is_refused_not_ignored() -> None:
    done = python("-m", "benchmarks.cluster_throughput", "--quikc")
    assert done.returncode == 2 and "unrecognized arguments: --quikc" in done.stderr


def test_missing_dependencies_stop_the_run_before_it_starts() -> None:
    missing = bench_run.missing_dependencies()
    if not missing:
        pytest.skip("the bench group is installed here: nothing is missing")
    started = time.monotonic()
    done = python("-m", "mcp_once", "bench", "--quick", "--json")
    assert done.returncode == 2 and done.stdout == ""
    assert time.monotonic() - started < 20  # nothing was measured
    assert "nothing was run" in done.stderr and "Powertools" in done.stderr
    assert "uv run --group bench mcp-once bench --quick --json" in done.stderr


def test_missing_dependencies_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_run._powertools, "unavailable_reason", lambda: "no boto3; x")
    monkeypatch.setattr(bench_run.shutil, "which", lambda name: None)
    named = " ".join(bench_run.missing_dependencies())
    assert "Powertools" in named and "no boto3" in named and "redis-server" in named


def fixed_run(met: list[bool | None]) -> Any:
    def run(quick: bool, **_: Any) -> dict[str, Any]:
        rows = [
            {"metric": f"m{n}", "measured": 1, "target": "t", "met": value}
            for n, value in enumerate(met)
        ]
        return {"targets": rows, "seconds": {"total": 0}, "environment": {}, "results": {}}

    return run


@pytest.mark.parametrize(
    ("met", "check", "code"),
    [
        ([True, False], True, 1),
        ([True, False], False, 0),  # without --check, a report, as before
        ([True, None], True, 0),  # not measured is not missed
        ([True, True], True, 0),
    ],
)
def test_check_exits_1_on_a_missed_target(
    met: list[bool | None],
    check: bool,
    code: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(bench_run, "missing_dependencies", lambda **_: [])
    monkeypatch.setattr(bench_run, "run", fixed_run(met))
    argv = ["--quick", *(["--check"] if check else [])]
    assert bench_run.main(argv) == code
    err = capsys.readouterr().err
    assert bool(re.search(r"targets missed: m1\b", err)) == (code == 1)
