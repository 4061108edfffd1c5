"""examples/observability.py, run as a user runs it: the names docs/observability.md lists are
the ones exported, the span tree of the retried call is the one the page shows, and neither the
order, the amount, the receipt nor the key appears in any span, metric or log line it prints."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "observability.py"


def caller_data() -> tuple[str, int, str, str]:
    spec = importlib.util.spec_from_file_location("observability_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ORDER, module.CENTS, module.RECEIPT, module.KEY


def sections(output: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current = ""
    for line in output.splitlines():
        if line.startswith("--- "):
            current = line[4:].split(",")[0].split(":")[0]
        found.setdefault(current, []).append(line)
    return found


def test_the_example_exports_the_documented_names_and_none_of_the_callers_data() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    part = sections(done.stdout)

    # The retried call, as the page tells it: a lost answer, a retry, a replay.
    assert any(
        line.startswith("on_retry: charge attempt 1 failed (maybe_executed")
        for line in out.splitlines()
    )
    assert "on_replay: charge answered from its record" in out
    (summary,) = [line for line in part["the call"] if line.startswith("--- the call")]
    assert re.fullmatch(r"--- the call: result, [23] attempts, replayed=True", summary)

    # The span tree: client call > attempts > the SDK's request > the server's span > the guard.
    tree = [line for line in part["span tree"][1:] if line.strip()]
    depth = {line.strip().split(" (")[0]: len(line) - len(line.lstrip()) for line in tree}
    assert depth["checkout"] == 0
    assert depth["mcp-once call charge"] == 2
    assert depth["mcp-once attempt charge"] == 4
    assert depth["MCP send tools/call charge"] == 6
    assert depth["tools/call charge"] == 8
    assert depth["mcp-once guard charge"] == 10
    guards = [line for line in tree if line.strip().startswith("mcp-once guard charge")]
    assert "mcp_once.outcome=executed" in guards[0]
    assert "mcp_once.outcome=replayed" in guards[-1] and "mcp_once.replayed=True" in guards[-1]
    (call,) = [line for line in tree if line.strip().startswith("mcp-once call charge")]
    for attribute in (
        "gen_ai.tool.name=charge",
        "mcp_once.outcome=result",
        "mcp_once.replayed=True",
        "mcp_once.key_source=caller",
    ):
        assert attribute in call

    # Metrics: the conventions' duration histograms and ours, on the console and for Prometheus.
    console = "\n".join(part["metrics"])
    for name in (
        "mcp.client.operation.duration [s]",
        "mcp.server.operation.duration [s]",
        "mcp_once.client.call.duration [s]",
        "mcp_once.client.attempts",
        "mcp_once.client.retries",
        "mcp_once.server.calls",
        "mcp_once.server.waits",
    ):
        assert f"metric {name}" in console, name
    for name in (
        "mcp_client_operation_duration_seconds_count",
        "mcp_server_operation_duration_seconds_count",
        "mcp_once_client_call_duration_seconds_count",
        "mcp_once_client_attempts_total",
        "mcp_once_server_calls_total",
    ):
        assert re.search(rf"^{name}\{{", done.stdout, re.MULTILINE), name

    # The caller's data, nowhere: not in a span, an event, a metric label or a log line.
    order, cents, receipt, key = caller_data()
    for secret in (order, receipt, key):
        assert secret not in out, secret
    assert not re.search(rf"(?<![\d.]){cents}(?!\d)", out)
    assert any(line.startswith("log DEBUG orchestrator") for line in out.splitlines())
