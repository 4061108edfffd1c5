"""The benchmark front door (`python -m benchmarks.run --quick --json`, behind `mcp-once bench`)
runs every benchmark path and reports the contract's headline figures.

Only invariants are asserted — round trips are counts, not timings; no timing is checked here.
The run uses the `--smoke` scale (every path, very short windows) to keep the suite fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from redis_server import redis_server_binary

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(redis_server_binary() is None, reason="redis-server is not on PATH"),
]

HEADLINE = (
    "redis_round_trips_first",
    "redis_round_trips_replay",
    "overhead_ratio_http",
    "outage_amplification",
    "vs_powertools_ratio",
)


def _powertools_importable() -> bool:
    try:
        import aws_lambda_powertools.utilities.idempotency.persistence.redis  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def quick_json() -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--json", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.stdout, f"no output; stderr:\n{done.stderr[-3000:]}"
    out = json.loads(done.stdout)
    assert isinstance(out, dict)
    # Only a missing Powertools baseline may fail the run (it lives in the bench group).
    errors = out.get("errors") or {}
    assert set(errors) <= {"powertools"}, errors
    assert done.returncode == (1 if errors else 0), done.stderr[-3000:]
    return out


def test_quick_json_has_every_headline_key(quick_json: dict[str, object]) -> None:
    for key in HEADLINE:
        assert key in quick_json, key
    for key in ("redis_round_trips_first", "overhead_ratio_http", "outage_amplification"):
        value = quick_json[key]
        assert isinstance(value, int | float) and value > 0, (key, value)
    if _powertools_importable():
        value = quick_json["vs_powertools_ratio"]
        assert isinstance(value, int | float) and value > 0
    else:
        assert quick_json["vs_powertools_ratio"] is None
        assert "powertools" in quick_json["errors"]  # type: ignore[operator]
    assert quick_json["targets"], "the targets table is empty"


def test_first_execution_costs_two_round_trips_and_replay_one(
    quick_json: dict[str, object],
) -> None:
    """Counted by Redis itself (total_reads_processed), per real MCP tool call."""
    assert quick_json["redis_round_trips_first"] == 2
    assert quick_json["redis_round_trips_replay"] == 1
    detail = quick_json["results"]["round_trips"]["mcp_once"]  # type: ignore[index]
    assert detail["first"]["commands_per_call"]["evalsha"] == 2
    assert detail["replay"]["commands_per_call"]["evalsha"] == 1
    # Renewals only for a tool running past a third of its lease: none below, one above.
    assert detail["renewal_short"]["renewals"] == 0
    assert detail["renewal_long"]["renewals"] == 1


def test_outage_budget_keeps_amplification_below_the_baseline(
    quick_json: dict[str, object],
) -> None:
    """An invariant of the budget, not a timing: with 10 tokens a total outage allows at most
    4 retries in all before the bucket is half empty; tenacity retries every call."""
    runs = quick_json["results"]["outage"]["contenders"]["mcp_once"]["runs"]  # type: ignore[index]
    for run in runs:
        retries = run["attempts_of_those"] - run["logical_calls_within_outage"]
        assert 0 <= retries <= 4, run
    baseline = quick_json["results"]["outage"]["contenders"]["tenacity"]["runs"]  # type: ignore[index]
    for run in baseline:
        assert run["attempts_of_those"] == 3 * run["logical_calls_within_outage"], run


def test_the_run_journal_benchmark_journals_every_call(quick_json: dict[str, object]) -> None:
    """Counts, not timings: every journalled call of the smoke scale left one entry in each
    journal (1 round of 10 calls and 3 warm-up calls, per transport), and Redis's bytes per
    entry are within the target (SQLite's file grows by whole pages: too few entries here)."""
    sizes = quick_json["results"]["run_journal"]["bytes_per_entry"]  # type: ignore[index]
    assert sizes["sqlite"]["entries"] == sizes["redis"]["entries"] == 2 * (10 + 3)
    assert 0 < sizes["redis"]["bytes_per_entry"] <= 300
    ratios = quick_json["journal_ratio_by_transport"]
    assert set(ratios) == {"in_process", "http"}  # type: ignore[arg-type]


def test_every_ratio_has_its_ceiling_measured_in_the_same_run(
    quick_json: dict[str, Any],
) -> None:
    """Shapes and signs, not timings: the two-round-trip ceiling, this disk's commit ceiling,
    the floor guard beside every keyed / unwrapped ratio, and CPU per call in process."""
    st = quick_json["results"]["store_throughput"]
    for where in ("blocking", "event_loop"):
        assert st["ceiling"][f"round_trip_us_{where}"]["median"] > 0
    if _powertools_importable():
        assert st["ceiling"]["vs_powertools_blocking"]["median"] > 0
    assert st["sqlite_commit_ceiling"]["median"] > 0
    assert set(st["contenders"]["sqlite"]) == {"1", "16"}
    co = quick_json["results"]["call_overhead"]
    for transport in ("in_process", "http"):
        for store, summary in co["latency"][transport].items():
            assert summary["floor_vs_plain_p50"]["median"] > 0, (transport, store)
    cpu = co["latency"]["in_process"]["memory"]["cpu_us_per_call"]
    assert all(cpu[variant]["median"] > 0 for variant in ("plain", "keyed", "floor"))
    assert "cpu_us_per_call" not in co["latency"]["http"]["memory"]  # the server's CPU is elsewhere
    assert co["event_loop"] == st["event_loop"] == quick_json["environment"]["event_loop"]
    assert co["event_loop"] == "asyncio"
    (guard,) = [row for row in quick_json["targets"] if row["metric"].startswith("guard CPU")]
    assert guard["measured"] is not None and guard["ceiling"] is not None


def test_quick_mode_keeps_the_embedded_stores_http_row_beside_its_floor(
    quick_json: dict[str, object],
) -> None:
    """The SQLite store is the default: `bench --quick` measures it over HTTP, with its floor,
    even though its in-process row (slow, one fsync per transition) is left to a full run."""
    by_store = quick_json["overhead_ratio_http_by_store"]
    floors = quick_json["floor_ratio_http_by_store"]
    assert isinstance(by_store, dict) and isinstance(floors, dict)
    assert {"memory", "sqlite", "redis"} <= set(by_store)
    assert isinstance(by_store["sqlite"], float) and isinstance(floors["sqlite"], float)
    assert "sqlite" not in quick_json["overhead_ratio_in_process_by_store"]  # type: ignore[operator]
