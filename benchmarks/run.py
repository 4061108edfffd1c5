"""Run every benchmark, side by side with its baseline, and check the figures against targets.

    uv run --group bench python -m benchmarks.run            # full, writes results/
    uv run --group bench python -m benchmarks.run --quick --json

`run(quick)` is what `mcp-once bench` calls. Quick mode (under a minute) uses one or two short
rounds and skips the result-size sweep; the full run takes several minutes, repeats each
measurement in interleaved rounds and writes `results/results.json` and the plot.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import _powertools
from ._redis import REPO
from ._scale import FULL, QUICK, SMOKE

RESULTS = Path(__file__).resolve().parent / "results"
PLOT = RESULTS / "latency_vs_result_size.png"
#: Always present in the output (None when the section that measures it did not run).
HEADLINE = (
    "redis_round_trips_first",
    "redis_round_trips_replay",
    "overhead_ratio_http",
    "outage_amplification",
    "vs_powertools_ratio",
)
SECTIONS = (
    "round_trips",
    "store_throughput",
    "record_memory",
    "call_overhead",
    "outage",
    "run_journal",
)
REPRODUCE = {
    "full": "uv run --group bench python -m benchmarks.run",
    "quick": "uv run --group bench python -m benchmarks.run --quick --json",
    "cli": "uv run --group bench mcp-once bench --quick --json",
    "with_group": "uv run --group bench mcp-once bench",
}


def _quiet() -> None:
    for name in (
        "httpx",
        "httpx2",
        "mcp",
        "uvicorn",
        "uvicorn.error",
        "idempotency",
        "orchestrator",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*remaining time.*")


def _section(name: str) -> Callable[..., dict[str, Any]]:
    if name == "round_trips":
        from . import round_trips

        return round_trips.measure
    if name == "store_throughput":
        from . import store_throughput

        return store_throughput.measure
    if name == "record_memory":
        from . import record_memory

        return record_memory.measure
    if name == "call_overhead":
        from . import call_overhead

        return call_overhead.measure
    if name == "run_journal":
        from . import run_journal

        return run_journal.measure
    from . import outage

    return outage.measure


def _redis_version() -> str:
    try:
        done = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    for part in done.stdout.split():
        if part.startswith("v="):
            return part[2:]
    return done.stdout.strip() or "unknown"


def _environment(quick: bool) -> dict[str, Any]:
    env: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "redis_server": _redis_version(),
        "powertools": _powertools.version() if _powertools.available() else None,
        "reproduce": REPRODUCE,
    }
    try:
        from importlib.metadata import version

        env["mcp"] = version("mcp")
        env["redis_py"] = version("redis")
    except Exception:  # metadata is informational only
        pass
    return env


def _targets(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Each contract target with the measured figure; `met` is None when not measured."""

    def row(metric: str, measured: Any, target: str, met: bool | None) -> dict[str, Any]:
        return {"metric": metric, "measured": measured, "target": target, "met": met}

    rows = []
    first, replay = out.get("redis_round_trips_first"), out.get("redis_round_trips_replay")
    rows.append(
        row(
            "Redis round trips per first execution / replay",
            None if first is None else f"{first:g} / {replay:g}",
            "2 / 1",
            None if first is None else (first == 2 and replay == 1),
        )
    )
    for transport, bound in (("http", 1.15), ("in_process", 2.0)):
        by_store = out.get(f"overhead_ratio_{transport}_by_store") or {}
        for store, value in by_store.items():
            label = f"keyed / unwrapped p50, {transport.replace('_', '-')}, {store} store"
            rows.append(row(label, value, f"<= {bound}x", value <= bound))
    value = out.get("vs_powertools_ratio")
    rows.append(
        row(
            "store throughput vs Powertools Redis layer (worst of 1/16/64 callers)",
            value,
            ">= 2x",
            None if value is None else value >= 2,
        )
    )
    value = (out.get("vs_redis_benchmark_ratio_by_callers") or {}).get("64")
    rows.append(
        row(
            "store throughput vs redis-benchmark limit (64 callers)",
            value,
            ">= 0.4",
            None if value is None else value >= 0.4,
        )
    )
    value = out.get("outage_amplification")
    rows.append(
        row(
            "attempts per logical call, total outage (tenacity: "
            f"{out.get('tenacity_amplification')})",
            value,
            "<= 1.1x",
            None if value is None else value <= 1.1,
        )
    )
    value = out.get("record_overhead_bytes")
    rows.append(
        row(
            "Redis bytes per record beyond a 200-byte result",
            value,
            "<= 300",
            None if value is None else value <= 300,
        )
    )
    for journal in ("sqlite", "redis"):
        value = out.get(f"journal_bytes_per_entry_{journal}")
        rows.append(
            row(
                f"run journal bytes per entry, {journal}",
                value,
                "<= 300",
                None if value is None else value <= 300,
            )
        )
    return rows


def _headline(out: dict[str, Any], results: dict[str, Any]) -> None:
    rt = results.get("round_trips", {})
    if "redis_round_trips_first" in rt:
        out["redis_round_trips_first"] = rt["redis_round_trips_first"]
        out["redis_round_trips_replay"] = rt["redis_round_trips_replay"]
    co = results.get("call_overhead", {})
    for key in (
        "overhead_ratio_http",
        "overhead_ratio_in_process",
        "overhead_ratio_http_by_store",
        "overhead_ratio_in_process_by_store",
    ):
        if key in co:
            out[key] = co[key]
    st = results.get("store_throughput", {})
    ratios = st.get("ratios", {})
    if ratios.get("vs_powertools"):
        out["vs_powertools_ratio"] = min(ratios["vs_powertools"].values())
        out["vs_powertools_ratio_by_callers"] = ratios["vs_powertools"]
    if ratios.get("vs_redis_benchmark"):
        out["vs_redis_benchmark_ratio"] = max(ratios["vs_redis_benchmark"].values())
        out["vs_redis_benchmark_ratio_by_callers"] = ratios["vs_redis_benchmark"]
    og = results.get("outage", {})
    if "outage_amplification" in og:
        out["outage_amplification"] = og["outage_amplification"]
        out["tenacity_amplification"] = og["tenacity_amplification"]
        ours = og["contenders"]["mcp_once"]
        out["outage_recover_first_success_s"] = ours["recover_first_success_s"]["median"]
    rj = results.get("run_journal", {})
    for key in (
        "journal_ratio_by_transport",
        "journal_bytes_per_entry_sqlite",
        "journal_bytes_per_entry_redis",
    ):
        if key in rj:
            out[key] = rj[key]
    rm = results.get("record_memory", {})
    if "record_overhead_bytes" in rm:
        out["record_overhead_bytes"] = rm["record_overhead_bytes"]


def run(quick: bool, *, only: tuple[str, ...] | None = None, smoke: bool = False) -> dict[str, Any]:
    """Run the benchmarks; the dict holds the headline figures, the targets, every section's
    detail and the environment. A section that fails is reported under `errors`, and a headline
    figure it could not measure is None. `smoke` (tests only) runs every path very briefly."""
    _quiet()
    scale = SMOKE if smoke else QUICK if quick else FULL
    started = time.perf_counter()
    out: dict[str, Any] = {"quick": quick, "scale": scale.name}
    out.update(dict.fromkeys(HEADLINE))
    environment = _environment(quick)
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    timings: dict[str, float] = {}
    if not _powertools.available():
        errors["powertools"] = str(_powertools.unavailable_reason())
    for name in only or SECTIONS:
        if name not in SECTIONS:
            raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(SECTIONS)}")
        began = time.perf_counter()
        try:
            results[name] = _section(name)(scale)
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            errors[name] = f"{type(exc).__name__}: {exc}"
        timings[name] = round(time.perf_counter() - began, 2)
    _headline(out, results)
    out["targets"] = _targets(out)
    environment["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out["environment"] = environment
    out["seconds"] = {**timings, "total": round(time.perf_counter() - started, 2)}
    if errors:
        out["errors"] = errors
    out["results"] = results
    return out


def _table(out: dict[str, Any]) -> str:
    lines = ["| metric | measured | target | met? |", "|---|---|---|---|"]
    for row in out["targets"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[row["met"]]
        lines.append(f"| {row['metric']} | {row['measured']} | {row['target']} | {met} |")
    return "\n".join(lines)


def missing_dependencies() -> list[str]:
    """What the benchmarks need and this environment lacks, each with how to get it. Checked
    before anything runs: a missing baseline found after minutes of measuring wastes them."""
    missing = []
    reason = _powertools.unavailable_reason()
    if reason is not None:
        missing.append(f"AWS Powertools, the baseline ({reason.split(';')[0]})")
    if importlib.util.find_spec("matplotlib") is None:
        missing.append("matplotlib, for the plot")
    if shutil.which("redis-server") is None:
        missing.append("redis-server on PATH (Debian/Ubuntu: apt-get install redis-server)")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp-once bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short rounds, under a minute")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--out",
        type=Path,
        help="write the JSON here (default for a full run: benchmarks/results/results.json)",
    )
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(SECTIONS)}")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a measured figure misses its target (for CI)",
    )
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # The smoke scale (tests only) runs without the bench group and reports Powertools missing.
    missing = [] if args.smoke else missing_dependencies()
    if missing:
        print(
            "mcp-once bench: nothing was run; missing: "
            + "; ".join(missing)
            + f"\nThe Python ones are the bench dependency group: {REPRODUCE['with_group']}"
            + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip(),
            file=sys.stderr,
        )
        return 2
    only = tuple(s.strip() for s in args.only.split(",")) if args.only else None
    out = run(args.quick, only=only, smoke=args.smoke)
    target = args.out or (None if args.quick or args.smoke or only else RESULTS / "results.json")
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(out, indent=2) + "\n")
    if target is not None and "call_overhead" in out["results"]:
        from .call_overhead import plot

        drawn = plot(out["results"]["call_overhead"], PLOT)
        if drawn is not None:
            out["plot"] = str(drawn.relative_to(REPO))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(_table(out))
        print(f"\n{out['seconds']['total']} s; environment: {json.dumps(out['environment'])}")
        if target is not None:
            print(f"results: {target}")
        if out.get("plot"):
            print(f"plot: {out['plot']}")
    missed = [row["metric"] for row in out["targets"] if row["met"] is False]
    if args.check and missed:
        print(f"targets missed: {'; '.join(missed)}", file=sys.stderr)
    if out.get("errors"):
        print(f"errors: {json.dumps(out['errors'])}", file=sys.stderr)
        return 1
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
