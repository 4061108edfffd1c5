"""`mcp-once demo`: run as a user runs it (the console script, a real server), read its JSON.

mcp-once must show no duplicate effect and the naive baseline must show some, on every
transport, with the default embedded store and with Redis. Bad options fail with a sentence.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mcp_once._cli import main
from mcp_once.scenarios import PipelineTotals, Report

SCRIPT = Path(sys.executable).with_name("mcp-once")
TIMEOUT = 240


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    command = (
        [str(SCRIPT)]
        if SCRIPT.exists()
        else [
            sys.executable,
            "-c",
            "import sys; from mcp_once._cli import main; sys.exit(main())",
        ]
    )
    return subprocess.run(
        # The in-doubt payment (two server processes killed and restarted) has its own test,
        # in the full tier: test_demo_in_doubt.py.
        [*command, "demo", "--no-in-doubt", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def summary(completed: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert completed.returncode == 0, completed.stderr[-2000:]
    data: dict[str, Any] = json.loads(completed.stdout)
    return data


def assert_shows_the_difference(data: dict[str, Any], calls: int) -> None:
    assert data["calls"] == calls
    assert data["faults_injected"] > 0
    assert data["duplicate_effects"] == 0
    assert data["baseline_duplicate_effects"] > 0
    assert data["lost_results"] == 0 and data["ok"] is True
    assert data["replays"] > 0  # mcp-once absorbed lost answers by replaying them
    assert data["mcp_once"]["gate_violations"] == 0


def test_default_run_over_memory_and_the_killed_pipelines() -> None:
    data = summary(demo("--json"))
    assert_shows_the_difference(data, 100)
    assert data["transport"] == "memory" and data["store"] == "a temporary SQLite file"
    assert data["faults"].get("server_restart") == 1
    # ~12 s on an idle 2-core machine; the bound only catches a hang or an order-of-magnitude
    # regression (a loaded machine took 35 s), since timing belongs in benchmarks.
    assert data["seconds"] < 120, "the default demo must stay quick"
    pipeline = data["pipeline"]
    run, fresh = pipeline["run"], pipeline["fresh_keys"]
    assert pipeline["pipelines"] == 2 and pipeline["seeds"] == [7, 8] and pipeline["ok"] is True
    assert pipeline["kills"] == run["kills"] == fresh["kills"] >= 6  # 3 or 4 per pipeline
    assert run["processes"] == fresh["processes"] == run["kills"] + 2
    assert pipeline["duplicate_effects"] == run["duplicate_effects"] == 0
    assert run["missing_effects"] == 0 and run["replays"] > 0 and fresh["replays"] == 0
    assert pipeline["baseline_duplicate_effects"] == fresh["duplicate_effects"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_over_a_real_wire(transport: str) -> None:
    data = summary(demo("--json", "--transport", transport, "--calls", "30", "--seed", "7"))
    assert_shows_the_difference(data, 30)
    assert data["transport"] == transport


@pytest.mark.slow
@pytest.mark.redis
def test_with_redis_over_http(redis_url: str) -> None:
    data = summary(demo("--json", "--transport", "http", "--store", redis_url, "--calls", "30"))
    assert_shows_the_difference(data, 30)
    assert data["store"].startswith(f"{redis_url}?prefix=mcp-once-demo:")


@pytest.mark.slow
def test_human_output_explains_and_compares() -> None:
    completed = demo("--calls", "30", "--seed", "3")
    assert completed.returncode == 0, completed.stderr[-2000:]
    out = completed.stdout
    assert out.startswith("30 MCP tool calls")  # the newcomer's explanation comes first
    assert "naive retry" in out and "mcp-once" in out
    row = next(line for line in out.splitlines() if line.startswith("duplicate effects"))
    naive, once = (int(cell) for cell in row.split()[-2:])
    assert once == 0 and naive > 0
    assert "30/30" in completed.stderr  # live progress, on stderr
    assert "Then agent pipelines: 2 eight-call pipeline(s)" in out
    table = out[out.index("fresh keys  ") :]
    row = next(line for line in table.splitlines() if line.startswith("duplicate effects"))
    fresh, run = (int(cell) for cell in row.split()[-2:])
    assert run == 0 and fresh > 0


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--calls", "0"], 2, "--calls must be between 1"),
        (["--seed", "-1"], 2, "--seed must be >= 0"),
        (["--transport", "stdio", "--store", "memory://"], 2, "lives inside one process"),
        (["--store", "bogus://x"], 2, "unknown key store scheme"),
        (["--store", "redis://127.0.0.1:1/0"], 3, "cannot be reached"),
        (["--transport", "carrier-pigeon"], 2, "invalid choice"),
        (["--pipelines", "-1"], 2, "--pipelines must be between 0 and 50"),
        (["--pipelines", "51"], 2, "--pipelines must be between 0 and 50"),
    ],
)
def test_bad_options_fail_with_a_sentence(args: list[str], code: int, message: str) -> None:
    completed = demo(*args)
    assert completed.returncode == code
    assert message in completed.stderr
    assert completed.stdout.strip() == "" or "MCP tool calls" in completed.stdout


def test_a_duplicate_under_mcp_once_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exit status is the verdict: a run where mcp-once let a duplicate through fails."""
    import mcp_once.scenarios

    async def fake(scenario: Any, mode: str, workdir: Path, **_: Any) -> Report:
        report = Report(mode=mode, transport="memory", era="modern", seed=0, calls=3)
        report.duplicates = 1
        return report

    monkeypatch.setattr(mcp_once.scenarios, "run_scenario", fake)
    assert main(["demo", "--calls", "3", "--pipelines", "0", "--no-in-doubt", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["duplicate_effects"] == 1 and data["ok"] is False
    assert data["pipeline"] is None


def test_a_duplicate_under_run_in_the_pipelines_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pipeline's verdict counts too: a duplicate effect under Run fails the demo."""
    import mcp_once.scenarios

    async def calls(scenario: Any, mode: str, workdir: Path, **_: Any) -> Report:
        return Report(mode=mode, transport="memory", era="modern", seed=0, calls=3)

    async def pipelines(seeds: Any, folder: Path, **_: Any) -> tuple[Any, Any]:
        fresh, run = PipelineTotals("fresh"), PipelineTotals("run")
        fresh.duplicates, run.duplicates = 5, 1
        return fresh, run

    monkeypatch.setattr(mcp_once.scenarios, "run_scenario", calls)
    monkeypatch.setattr(mcp_once.scenarios, "run_pipelines", pipelines)
    assert main(["demo", "--calls", "3", "--pipelines", "1", "--no-in-doubt", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["duplicate_effects"] == 0 and data["ok"] is False
    assert data["pipeline"]["duplicate_effects"] == 1 and data["pipeline"]["ok"] is False
