"""The "OpenAI Agents x Temporal" leg (#22), run in its own uv environment from this suite.

Why a separate environment: `temporalio-openai-agents` 1.1.0 (`temporalio[openai-agents]`, the
newest on the index) pins `openai-agents>=0.22,<0.23`, and this environment tests mcp-once against
openai-agents 0.24.0. `tests/envs/openai-agents-temporal` installs mcp-once from this checkout
with its `openai-agents` extra (>=0.22,<0.25) beside the plugin, from its own lock file, and runs:
its crash test (a Temporal dev server, a worker process killed before / during / after the MCP
call, the shop's ledger) and, at the same time in a second run, this suite's OpenAI Agents tests
over HTTP, on openai-agents 0.22.
Started from here rather than from `.ci/run`, so that a plain `uv run pytest` runs the leg too.
Under CI a missing `uv` fails; elsewhere it skips, loudly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "envs" / "openai-agents-temporal"
UNDER_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
#: The leg's own bound: its env's first sync, a dev server and ten worker processes.
TIMEOUT = 600


def test_openai_agents_on_temporal_in_its_own_environment(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    if uv is None:
        reason = "UV NOT AVAILABLE: the OpenAI Agents x Temporal leg needs `uv` to build its env"
        if UNDER_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    pytest_in_env = [uv, "run", "--project", str(PROJECT), "--frozen", "pytest"]
    runs = [
        # The leg's own tests: the crash cases (side by side) and the example.
        [*pytest_in_env, "-p", "no:cacheprovider", "-q", "-rs", str(PROJECT / "tests")],
        # This suite's OpenAI Agents tests on 0.22, at the same time: they mostly wait out
        # attempt timeouts (seconds of wall time, little CPU).
        # That environment has no pytest-xdist: our addopts' `-n` would be refused there.
        [*pytest_in_env, "-p", "no:cacheprovider", "-q", "-rs", "-o", "addopts=-ra",
         "tests/frameworks/test_openai_agents.py", "-k", "not stdio"],
    ]  # fmt: skip
    # Both at once (on a first run, uv's lock on the environment makes one wait for the sync).
    logs = [tmp_path / f"run-{index}.log" for index in range(len(runs))]
    processes = []
    for argv, log in zip(runs, logs, strict=True):
        with log.open("wb") as out:
            processes.append(
                subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            )
    try:
        for process in processes:
            process.wait(timeout=TIMEOUT)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, log in zip(processes, logs, strict=True):
        output = log.read_text(errors="replace")
        assert process.returncode == 0, output
        if " skipped" in output.splitlines()[-1]:
            if UNDER_CI:
                pytest.fail(f"the leg skipped tests under CI:\n{output}")
            pytest.skip(f"the leg skipped tests:\n{output}")
