"""Operator commands on a million records: `keys list --limit 10`, `keys list --state unknown`
and `audit verify` on Redis and SQLite, and how long `mcp-once` takes to start (issue 48).

    uv run python -m benchmarks.operator_commands [--records N] [--stores redis,sqlite]
        [--rounds N] [--tree PATH] [--timeout S] [--out FILE]

Each command runs as an operator runs it: `python -m mcp_once ...`, a process of its own, with
the checkout `--tree` names first on its path (this one by default: `--tree` of another checkout,
e.g. main's, gives the figures before a change, the stores filled the same way). Measured per
command: wall time from start to exit (median of `--rounds`, with min and max), the CPU time
the process used (user + system: on a shared machine it moves less than wall time), its peak
resident memory, its exit status and last line of output, and on Redis what it sent
(`INFO` around the first round: round trips, calls per command, keys looked up, and the
CPU seconds redis-server spent).

Start-up: `mcp-once --help`, `keys list --help` and `audit verify --help`, which do nothing but
import and build the parser, and `keys list --limit 10` on a store of a few records.

The stores are filled in bulk with the stores' own encoders (`_populate.py`: a million records
in about a minute each): one record in 100,000 UNKNOWN, one IN_PROGRESS, the rest COMPLETED with
a 200-byte result, each with its history. A private redis-server on loopback
(`tests/redis_server.py`); the SQLite file in a temporary directory, its schema made by the
store of `--tree`. Not part of `run.py`: filling takes minutes, and the figures it checks
(under 1 s to list, under 0.5 s to start) are absolute, judged on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from . import _populate
from ._redis import RedisServer, read_counters

HERE = Path(__file__).resolve().parents[1]
#: The commands on a full store, by the name the results give them.
COMMANDS: dict[str, list[str]] = {
    "keys list --limit 10": ["keys", "list", "--limit", "10"],
    "keys list --state unknown": ["keys", "list", "--state", "unknown"],
    "audit verify": ["audit", "verify"],
}
#: What start-up is measured on: the parser only, then a listing of a small store.
STARTUP: dict[str, list[str]] = {
    "--help": ["--help"],
    "keys list --help": ["keys", "list", "--help"],
    "audit verify --help": ["audit", "verify", "--help"],
}
SMALL_STORE = 100
#: Issue 48's targets, in seconds.
LIST_TARGET = 1.0
STARTUP_TARGET = 0.5


#: Runs `mcp-once *argv` (its output to this process's stdout) and prints, on stderr, its wall
#: time, CPU time, peak memory and status. A small process of its own starts the command: a
#: child forked from a big one (the benchmark, which filled stores) counts the parent's pages in
#: its peak memory (`ru_maxrss`).
_LAUNCHER = """
import json, os, subprocess, sys, time
started = time.perf_counter()
child = subprocess.Popen([sys.executable, "-m", "mcp_once", *sys.argv[1:]])
_, status, usage = os.wait4(child.pid, 0)
child.returncode = os.waitstatus_to_exitcode(status)
print(json.dumps({
    "seconds": time.perf_counter() - started,
    "cpu_seconds": usage.ru_utime + usage.ru_stime,
    "rss_mib": round(usage.ru_maxrss / 1024, 1),
    "exit": child.returncode,
}), file=sys.stderr)
"""


def run_command(tree: Path, argv: Sequence[str], *, cwd: Path, timeout: float) -> dict[str, Any]:
    """One run of `mcp-once *argv` in its own process: wall seconds, CPU seconds, peak RSS
    (MiB), exit status, last line of output; `killed_after_timeout` past `timeout`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryFile() as out:
        launcher = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, *argv],
            cwd=cwd,  # not a checkout: `-m` puts the working directory first on the path
            env=env,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: a timeout ends the command too
        )
        try:
            _, err = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
            return {"seconds": timeout, "cpu_seconds": 0.0, "rss_mib": 0.0, "exit": None,
                    "killed_after_timeout": True, "last_line": ""}  # fmt: skip
        out.seek(0)
        lines = out.read().decode(errors="replace").strip().splitlines()
    figures: dict[str, Any] = json.loads(err.strip().splitlines()[-1])
    return {**figures, "killed_after_timeout": False, "last_line": lines[-1] if lines else ""}


def measure_command(
    tree: Path,
    argv: Sequence[str],
    *,
    cwd: Path,
    rounds: int,
    timeout: float,
    server: RedisServer | None = None,
) -> dict[str, Any]:
    """`rounds` runs of one command: the median and spread of their wall times, the rest from
    the first run (and, on Redis, what the first run sent)."""
    runs: list[dict[str, Any]] = []
    used: dict[str, Any] | None = None
    for round_ in range(rounds):
        admin = server.client() if server is not None and round_ == 0 else None
        before = None if admin is None else (read_counters(admin), _redis_cpu(admin))
        runs.append(run_command(tree, argv, cwd=cwd, timeout=timeout))
        if admin is not None and before is not None:
            used = read_counters(admin).minus(before[0])
            used["redis_cpu_s"] = round(_redis_cpu(admin) - before[1], 3)
            admin.close()
        if runs[-1]["killed_after_timeout"]:
            break  # another round would only wait as long again
    times = [run["seconds"] for run in runs]
    result: dict[str, Any] = {
        "median_s": round(statistics.median(times), 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
        "cpu_median_s": round(statistics.median(run["cpu_seconds"] for run in runs), 3),
        "rounds": len(runs),
        "rss_mib": runs[0]["rss_mib"],
        "exit": runs[0]["exit"],
        "last_line": runs[0]["last_line"],
    }
    if runs[0]["killed_after_timeout"]:
        result["killed_after_timeout_s"] = timeout
    if used is not None:
        result["redis"] = used
    return result


def _redis_cpu(client: redis.Redis) -> float:
    """Seconds of CPU the redis-server process has used (user + system)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _environment(tree: Path) -> dict[str, Any]:
    try:
        redis_version = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except OSError:
        redis_version = "unknown"
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "tree": str(tree),
        "python": platform.python_version(),
        "redis": redis_version,
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
    }


def measure(
    records: int, stores: Sequence[str], rounds: int, tree: Path, timeout: float
) -> dict[str, Any]:
    found: dict[str, Any] = {"records": records, "environment": _environment(tree)}
    with tempfile.TemporaryDirectory(prefix="mcp-once-operator-") as folder:
        cwd = Path(folder)
        found["startup"] = {
            name: measure_command(tree, argv, cwd=cwd, rounds=max(rounds, 5), timeout=timeout)
            for name, argv in STARTUP.items()
        }
        small = cwd / "small.db"
        _populate.fill_elsewhere("sqlite", str(small), SMALL_STORE, tree)
        found["startup"][f"keys list --limit 10 (SQLite, {SMALL_STORE} records)"] = (
            measure_command(
                tree, [*COMMANDS["keys list --limit 10"], "--store", f"sqlite:///{small}"],
                cwd=cwd, rounds=max(rounds, 5), timeout=timeout,
            )
        )  # fmt: skip
        found["fill_seconds"] = {}
        if "sqlite" in stores:
            path = cwd / "keys.db"
            filled = _populate.fill_elsewhere("sqlite", str(path), records, tree)
            found["fill_seconds"]["sqlite"] = round(filled)
            found["sqlite"] = {
                name: measure_command(
                    tree,
                    [*argv, "--store", f"sqlite:///{path}"],
                    cwd=cwd,
                    rounds=rounds,
                    timeout=timeout,
                )
                for name, argv in COMMANDS.items()
            }
            path.unlink()
        if "redis" in stores:
            with RedisServer() as server:
                filled = _populate.fill_elsewhere("redis", server.url, records)
                found["fill_seconds"]["redis"] = round(filled)
                client = redis.Redis.from_url(server.url)
                try:
                    found["redis_used_memory_mib"] = round(
                        int(client.info("memory")["used_memory"]) / 2**20
                    )
                finally:
                    client.close()
                found["redis"] = {
                    name: measure_command(
                        tree,
                        [*argv, "--store", server.url],
                        cwd=cwd,
                        rounds=rounds,
                        timeout=timeout,
                        server=server,
                    )
                    for name, argv in COMMANDS.items()
                }
    found["environment"]["load_average_after"] = os.getloadavg()
    found["targets"] = _targets(found)
    return found


def _targets(found: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for store in ("redis", "sqlite"):
        for name in ("keys list --limit 10", "keys list --state unknown"):
            if store in found:
                measured = found[store][name]["median_s"]
                rows.append(_target(f"{name} ({store})", measured, LIST_TARGET))
    for name, figures in found["startup"].items():
        rows.append(_target(f"start-up: {name}", figures["median_s"], STARTUP_TARGET))
    return rows


def _target(what: str, measured: float, target: float) -> dict[str, Any]:
    return {"what": what, "measured_s": measured, "target_s": target, "met": measured < target}


def main(argv: Sequence[str] | None = None) -> None:
    lines = (__doc__ or "").strip().splitlines()
    parser = argparse.ArgumentParser(description=lines[0] + " " + lines[1])
    parser.add_argument("--records", type=int, default=1_000_000, help="records per store")
    parser.add_argument(
        "--stores", default="redis,sqlite", help="comma-separated: redis, sqlite (default: both)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs per command (median)")
    parser.add_argument(
        "--tree",
        type=Path,
        default=HERE,
        help="the checkout whose mcp-once is measured (default: this one)",
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds before a command is killed"
    )
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    stores = [s for s in args.stores.split(",") if s]
    unknown = set(stores) - {"redis", "sqlite"}
    if unknown or args.records < 1 or args.rounds < 1:
        parser.error("--stores takes redis and sqlite; --records and --rounds at least 1")
    figures = measure(args.records, stores, args.rounds, args.tree.resolve(), args.timeout)
    text = json.dumps(figures, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
