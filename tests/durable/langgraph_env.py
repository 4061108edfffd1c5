"""The LangGraph environment the LangGraph legs run their workers in, made by the test suite.

`langchain-mcp-adapters` 0.3 needs `mcp` < 2 and mcp-once needs `mcp` 2, so the LangGraph side
(`integrations/langgraph`, the `mcp-once-langgraph` distribution) is a `uv` project of its own
with its own lock. The first LangGraph test of a run syncs it (`uv sync --frozen --project
integrations/langgraph`, a no-op when it is current) and every worker runs with its Python. So
`uv run pytest` on a fresh clone needs nothing else; under CI (CI=true) an environment that
cannot be made fails the test, elsewhere the test is skipped with the reason, loudly.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "integrations" / "langgraph"
UNDER_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
#: Generous: a first sync on a fresh machine downloads the environment's wheels.
SYNC_TIMEOUT = 600.0


@functools.cache
def _synced() -> Path | str:
    """The environment's Python, or why it could not be made (once per test run)."""
    uv = os.environ.get("UV") or shutil.which("uv")
    if uv is None:
        return "uv is not on PATH (it makes the LangGraph environment)"
    # The main environment's own variables must not point uv at it.
    ignored = ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    env = {k: v for k, v in os.environ.items() if k not in ignored}
    try:
        done = subprocess.run(
            [uv, "sync", "--frozen", "--project", str(PROJECT)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=SYNC_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return f"`uv sync --project {PROJECT}` took over {SYNC_TIMEOUT:.0f}s"
    except OSError as exc:
        return f"cannot run {uv}: {exc}"
    if done.returncode != 0:
        return f"`uv sync --frozen --project {PROJECT}` failed:\n{done.stderr[-2000:]}"
    python = PROJECT / ".venv" / "bin" / "python"
    if not python.exists():
        return f"`uv sync` made no interpreter at {python}"
    return python


def langgraph_python() -> Path:
    """The LangGraph environment's Python: made if need be; else a failure under CI, a skip
    with the reason elsewhere."""
    made = _synced()
    if isinstance(made, Path):
        return made
    message = f"LANGGRAPH ENVIRONMENT NOT AVAILABLE: {made}"
    if UNDER_CI:
        pytest.fail(message)
    pytest.skip(message)
