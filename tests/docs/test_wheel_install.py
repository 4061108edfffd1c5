"""The README's Install section, run: build the wheel, install it with an extra into a new venv.

A fresh clone's user follows exactly these steps (`uv build`, `uv venv`, `uv pip install
'dist/mcp_once-….whl[fastmcp]'`); the new environment must import both libraries, the extra's
integration, and run `mcp-once --help`. It resolves the dependencies from the package index (or
uv's cache), so it is in the slow tier; under CI a missing `uv` is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNDER_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def run(*argv: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.slow
def test_built_wheel_installs_with_an_extra_into_a_fresh_venv(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    if uv is None:
        reason = "UV NOT FOUND on PATH: the install check needs it"
        if UNDER_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    dist = tmp_path / "dist"
    run(uv, "build", "--wheel", "--out-dir", str(dist))
    [wheel] = dist.glob("mcp_once-*.whl")
    assert (ROOT / "README.md").read_text().count(f"dist/{wheel.name}[fastmcp]") >= 1, (
        "the README's Install section names another wheel"
    )
    venv = tmp_path / "venv"
    run(uv, "venv", "--quiet", str(venv))
    run(uv, "pip", "install", "--quiet", "--python", str(venv), f"{wheel}[fastmcp]")
    python, script = venv / "bin" / "python", venv / "bin" / "mcp-once"
    probe = (
        "import idempotency, orchestrator, mcp_once, idempotency.fastmcp, orchestrator.fastmcp;"
        "print(idempotency.__file__); print(orchestrator.__file__);"
        "print(idempotency.idempotent.__name__, orchestrator.RetryingSession.__name__)"
    )
    # From a directory outside the checkout: the installed packages, not the source tree.
    *files, names = run(str(python), "-c", probe, cwd=tmp_path).splitlines()
    assert all(file.startswith(str(venv)) for file in files), files
    assert names == "idempotent RetryingSession"
    assert "keys" in run(str(script), "--help", cwd=tmp_path)
    # No checkout here: bench's help still answers (exit 0), saying where the benchmarks are.
    bench_help = " ".join(run(str(script), "bench", "--help", cwd=tmp_path).split())
    assert "not in the installed package" in bench_help
